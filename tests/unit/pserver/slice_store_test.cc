#include "pserver/slice_store.h"

#include <cmath>
#include <optional>

#include <gtest/gtest.h>

#include "scheduler/shard_map.h"
#include "tests/unit/pserver/slice_store_fixture.h"
#include "tests/testing/test_frames.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

using testing::RequestBytes;
using testing::Split;

using store_testing::Got;
using store_testing::OneKeyMap;
using store_testing::SliceStoreTest;

TEST_F(SliceStoreTest, TwoBitPushesSumWithFloatPushesFromChunkedFrames) {
  Make(2);
  Got a, b;
  // Worker 0 still in its warm-up (float32), worker 1 compressed: the server takes both.
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a);
  SendTwoBit(1, wire::Op::kPushPullTwoBit, 1, {0.7f, -0.2f, -3.0f, 0.5f}, &b);
  ASSERT_TRUE(a.called && b.called);
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_EQ(a.values, (std::vector<float>{1.5f, 2, 2.5f, 4.5f}));
  EXPECT_EQ(b.values, a.values);
  // Both compressed, and the step's first push writes the decoded values.
  Got c, d;
  SendTwoBit(1, wire::Op::kPushTwoBit, 2, {-1, 0, 1, 0}, &c);
  SendTwoBit(0, wire::Op::kPushPullTwoBit, 2, {-1, 0, 0.25f, 9}, &d);
  ASSERT_TRUE(c.status.ok() && d.status.ok()) << c.status.ToString() << d.status.ToString();
  EXPECT_TRUE(c.values.empty());
  EXPECT_EQ(d.values, (std::vector<float>{-1, 0, 0.5f, 0.5f}));
}

TEST_F(SliceStoreTest, BadTwoBitFrameIsRefusedAndDoesNotCount) {
  Make(1);
  std::vector<float> five(5, 1.0f), residual(5, 0.0f);
  std::vector<uint8_t> wrong(TwoBitEncodedBytes(5));
  ASSERT_TRUE(TwoBitEncode(five.data(), residual.data(), 5, 0.5f, wrong.data(), wrong.size()).ok());
  BadFrameIsRefusedAndDoesNotCount(
      wire::Op::kPushPullTwoBit, wrong,
      "key 7 (w) slice 0: pushpull2bit: 2bit frame: element count 5 does not match the "
      "expected 4");
}

TEST_F(SliceStoreTest, UpdateModeTakesTwoBitPushes) {
  OptimizerSpec sgd;
  sgd.learningRate = 0.5;
  Make(2, ServerMode::kUpdate, sgd);
  Got i0;
  Send(0, wire::Op::kInit, 0, {1, 1, 1, 1}, &i0);
  ASSERT_TRUE(i0.status.ok()) << i0.status.ToString();
  Got a, b;
  SendTwoBit(0, wire::Op::kPushPullTwoBit, 1, {1, 1, -1, 0}, &a);
  SendTwoBit(1, wire::Op::kPushPullTwoBit, 1, {1, -1, -1, 0}, &b);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.ToString() << b.status.ToString();
  // mean gradient {0.5, 0, -0.5, 0}; w -= 0.5 * g
  EXPECT_EQ(a.values, (std::vector<float>{0.75f, 1, 1.25f, 1}));
  EXPECT_EQ(b.values, a.values);
}

TEST_F(SliceStoreTest, AggregateSumsAndPullWaitsForAllWorkers) {
  Make(2);
  Got a, b;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a);
  EXPECT_FALSE(a.called) << "a pull before every push of the step must wait";
  Send(1, wire::Op::kPushPull, 1, {10, 20, 30, 40}, &b);
  ASSERT_TRUE(a.called && b.called);
  EXPECT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_EQ(a.values, (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(b.values, a.values);
  EXPECT_EQ(store_->CompleteStep(7, 0), 1);
}

TEST_F(SliceStoreTest, FastWorkerMayPushNextStepBeforeSlowPull) {
  Make(2);
  Got p0, p1, q0, q1, slow;
  Send(0, wire::Op::kPush, 1, {1, 1, 1, 1}, &p0);
  Send(1, wire::Op::kPush, 1, {2, 2, 2, 2}, &p1);
  Send(0, wire::Op::kPull, 1, {}, &q0);
  EXPECT_EQ(q0.values, (std::vector<float>{3, 3, 3, 3}));
  Send(0, wire::Op::kPush, 2, {5, 5, 5, 5}, &q1);  // fast worker moves on
  Send(1, wire::Op::kPush, 2, {5, 5, 5, 5}, &slow);  // slow worker pushes 2 before pulling 1
  Send(1, wire::Op::kPull, 1, {}, &slow);
  ASSERT_TRUE(slow.status.ok()) << slow.status.ToString();
  EXPECT_EQ(slow.values, (std::vector<float>{3, 3, 3, 3})) << "step 1 is kept in the window";
}

TEST_F(SliceStoreTest, StepOutsideWindowIsRefused) {
  Make(1);
  Got g;
  Send(0, wire::Op::kPush, 3, {1, 2, 3, 4}, &g);
  ASSERT_TRUE(g.called);
  EXPECT_EQ(g.status.code(), StatusCode::kOutOfRange);
  EXPECT_NE(g.status.message().find("push for step 3 outside the window: the server expects step 1"),
            std::string::npos)
      << g.status.message();
  Got p;
  Send(0, wire::Op::kPull, 9, {}, &p);
  EXPECT_EQ(p.status.code(), StatusCode::kOutOfRange);
  EXPECT_NE(p.status.message().find("pull of step 9 outside the window [0, 1]"), std::string::npos)
      << p.status.message();
  Got ok;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &ok);  // still serving
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(ok.values, (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(SliceStoreTest, UnknownKeyWrongLengthDuplicatePush) {
  Make(2);
  Got g;
  Send(0, wire::Op::kPush, 1, {1, 2, 3, 4}, &g, /*key=*/8);
  EXPECT_EQ(g.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(g.status.message(), "unknown key 8 (not in the shard map)");
  Got s;
  Send(0, wire::Op::kPush, 1, {1, 2, 3, 4}, &s, 7, /*slice=*/3);
  EXPECT_NE(s.status.message().find("unknown key 7 (w) slice 3: the key has 1 slices"),
            std::string::npos)
      << s.status.message();
  Got l;
  Send(0, wire::Op::kPush, 1, {1, 2, 3}, &l);
  EXPECT_EQ(l.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(l.status.message(), "key 7 (w) slice 0: push of 3 elements, the slice has 4");
  Got d1, d2;
  Send(0, wire::Op::kPush, 1, {1, 2, 3, 4}, &d1);
  Send(0, wire::Op::kPush, 1, {1, 2, 3, 4}, &d2);
  EXPECT_TRUE(d1.status.ok());
  EXPECT_EQ(d2.status.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(d2.status.message().find("pushed step 1 twice"), std::string::npos);
}

TEST_F(SliceStoreTest, HeldByAnotherServer) {
  StoreConfig c;
  c.server_rank = 1;
  store_ = std::make_unique<SliceStore>(c);
  int64_t n, b;
  // 8 elements in 16-byte slices: slices 0 and 1, round robin over 2 servers.
  ASSERT_TRUE(store_->Install(OneKeyMap(7, 8, 2, 16), &n, &b).ok());
  EXPECT_EQ(n, 1);
  Got g;
  Send(0, wire::Op::kPush, 1, {1, 2, 3, 4}, &g, 7, 0);
  EXPECT_EQ(g.status.message(), "key 7 (w) slice 0 is held by server 0, not server 1");
}

TEST_F(SliceStoreTest, DifferentMapIsRefused) {
  Make(1);
  int64_t n, b;
  EXPECT_TRUE(store_->Install(OneKeyMap(7, 4), &n, &b).ok());
  auto st = store_->Install(OneKeyMap(7, 5), &n, &b);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
}

// Deferred init: a map that adds keys adds their slices; the installed ones keep their state.
TEST_F(SliceStoreTest, AMapThatAddsKeysExtendsTheStore) {
  Make(1);
  Got a;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a);
  ASSERT_TRUE(a.status.ok());
  auto bigger = ExtendShardMap(OneKeyMap(7, 4), {[] {
                                 v1::KeySpec k;
                                 k.set_id(9);
                                 k.set_name("late");
                                 k.set_num_elements(2);
                                 k.set_dtype(v1::DTYPE_FLOAT32);
                                 return k;
                               }()});
  ASSERT_TRUE(bigger.ok());
  int64_t n = 0, b = 0;
  ASSERT_TRUE(store_->Install(*bigger, &n, &b).ok());
  EXPECT_EQ(n, 2);
  EXPECT_EQ(b, 24);
  ASSERT_TRUE(store_->Install(*bigger, &n, &b).ok());  // every worker relays it: no-op
  EXPECT_EQ(store_->CompleteStep(7, 0), 1);          // untouched
  Got c;
  Send(0, wire::Op::kPushPull, 1, {5, 6}, &c, /*key=*/9);
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.values, (std::vector<float>{5, 6}));
  // The old map again (it lacks key 9) is refused, naming what is wrong.
  auto st = store_->Install(OneKeyMap(7, 4), &n, &b);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
}

TEST_F(SliceStoreTest, BroadcastInitWakesStepZeroPulls) {
  Make(2);
  Got pull;
  Send(1, wire::Op::kPull, 0, {}, &pull);
  EXPECT_FALSE(pull.called);
  Got init;
  Send(0, wire::Op::kInit, 0, {9, 8, 7, 6}, &init);
  EXPECT_TRUE(init.status.ok());
  ASSERT_TRUE(pull.called);
  EXPECT_EQ(pull.values, (std::vector<float>{9, 8, 7, 6}));
}

TEST_F(SliceStoreTest, UpdateModeNeedsInit) {
  Make(1, ServerMode::kUpdate);
  Got g;
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &g);
  EXPECT_EQ(g.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(g.status.message().find("before the key was initialized"), std::string::npos);
}

TEST_F(SliceStoreTest, UpdateModeSgdMomentumOnMeanGradient) {
  OptimizerSpec o;
  o.type = OptimizerType::kSgd;
  o.learningRate = 0.1;
  o.momentum = 0.9;
  o.weightDecay = 0.01;
  Make(2, ServerMode::kUpdate, o);
  Got i;
  Send(0, wire::Op::kInit, 0, {1, 2, 3, 4}, &i);
  std::vector<float> w = {1, 2, 3, 4}, v(4, 0.0f);
  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g0 = {0.5f * step, -1, 2, 0}, g1 = {1.5f, 1, 0, -4};
    Got a, b;
    Send(0, wire::Op::kPushPull, step, g0, &a);
    Send(1, wire::Op::kPushPull, step, g1, &b);
    for (int k = 0; k < 4; ++k) {
      float g = (g0[k] + g1[k]) * 0.5f + 0.01f * w[k];
      v[k] = 0.9f * v[k] + g;
      w[k] -= 0.1f * v[k];
    }
    ASSERT_TRUE(a.status.ok()) << a.status.ToString();
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(a.values[k], w[k], 1e-6) << step;
    EXPECT_EQ(a.values, b.values);
  }
}

TEST_F(SliceStoreTest, UpdateModeAdamBiasCorrected) {
  OptimizerSpec o;
  o.type = OptimizerType::kAdam;
  o.learningRate = 0.01;
  Make(1, ServerMode::kUpdate, o);
  Got i;
  Send(0, wire::Op::kInit, 0, {1, 1, 1, 1}, &i);
  Got a;
  Send(0, wire::Op::kPushPull, 1, {0.3f, -2, 0.001f, 5}, &a);
  // First Adam step: m_hat = g, v_hat = g^2, so w -= lr * sign(g) (up to eps).
  ASSERT_TRUE(a.status.ok());
  EXPECT_NEAR(a.values[0], 1 - 0.01, 1e-6);
  EXPECT_NEAR(a.values[1], 1 + 0.01, 1e-6);
  EXPECT_NEAR(a.values[2], 1 - 0.01, 1e-5);
  EXPECT_NEAR(a.values[3], 1 - 0.01, 1e-6);
}

TEST_F(SliceStoreTest, ManyStepsWithRecycledBuffersStayExact) {
  Make(2);
  std::vector<float> kept;  // an answer still held while the slice moves on
  for (int step = 1; step <= 6; ++step) {
    Got a, b;
    float x = static_cast<float>(step);
    Send(0, wire::Op::kPushPull, step, {x, x, x, x}, &a);
    Send(1, wire::Op::kPushPull, step, {1, 2, 3, 4}, &b);
    ASSERT_TRUE(a.status.ok()) << a.status.ToString();
    EXPECT_EQ(a.values, (std::vector<float>{x + 1, x + 2, x + 3, x + 4})) << step;
    if (step == 2) kept = a.values;
  }
  EXPECT_EQ(kept, (std::vector<float>{3, 4, 5, 6}));
}

// The TCP reader's buffer: a first push is swapped into the slice instead of copied (a 4 MiB
// memcpy per slice and step), and what comes back is a spare of the same size that no answer
// still references. The reader overwrites it with the next request, as here.
TEST_F(SliceStoreTest, FirstPushTakesTheReadersBufferAndNeverHandsBackALiveAnswer) {
  Make(2);
  std::vector<float> reader(4);  // the connection's reused payload buffer
  Values held;                   // an answer still being sent while the slice moves on
  int swapped = 0;
  for (int step = 1; step <= 8; ++step) {
    const float x = static_cast<float>(step);
    std::fill(reader.begin(), reader.end(), x);
    wire::RequestHeader h;
    h.op = wire::Op::kPushPull;
    h.key = 7;
    h.step = step;
    h.payload_bytes = reader.size() * sizeof(float);
    uint8_t head[wire::kRequestHeaderBytes];
    wire::EncodeRequestHeader(h, head);
    const float* before = reader.data();
    wire::Chunks chunks = {std::span<const uint8_t>(head, sizeof head),
                           std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(reader.data()),
                                                    h.payload_bytes)};
    uint64_t id;
    ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
    Values answer;
    store_->Handle(0, h, chunks, [&](const Status& st, Answer a) {
      ASSERT_TRUE(st.ok()) << st.ToString();
      answer = a.values;
    }, &reader);
    ASSERT_EQ(reader.size(), 4u) << "the reader must get a buffer of the same size back";
    if (reader.data() != before) ++swapped;
    std::fill(reader.begin(), reader.end(), -1.0f);  // the reader's next request lands here
    Got b;
    Send(1, wire::Op::kPushPull, step, {1, 2, 3, 4}, &b);
    ASSERT_TRUE(answer) << step;
    EXPECT_EQ(*answer, (std::vector<float>{x + 1, x + 2, x + 3, x + 4})) << step;
    if (step == 4) held = answer;
  }
  // Steps 1 and 2 have no spare yet (copied); from then on a spare exists unless an answer of
  // two steps ago is still held (step 4's blocks one swap).
  EXPECT_GE(swapped, 4);
  EXPECT_EQ(*held, (std::vector<float>{5, 6, 7, 8})) << "a held answer was handed to the reader";
}

TEST_F(SliceStoreTest, FailWaitersAnswersPendingPulls) {
  Make(2);
  Got g;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &g);
  store_->FailWaiters(UnavailableError("shutting down"));
  ASSERT_TRUE(g.called);
  EXPECT_EQ(g.status.code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trellis
