// A restarted (fresh) server rebuilds its slices from the workers' replayed pushes
// (pserver/slice_rebuild.h).
#include <stdlib.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using store_testing::OneKeyMap;
using testing::ReplayBytes;
using testing::RequestBytes;
using testing::Split;

class RebuildTest : public ::testing::Test {
 protected:
  void Make(int32_t workers, ServerMode mode = ServerMode::kAggregate, std::string path = "") {
    StoreConfig c;
    c.num_workers = workers;
    c.mode = mode;
    c.optimizer.learningRate = 0.5;
    c.checkpoint_path = std::move(path);
    store_ = std::make_unique<SliceStore>(c);
    int64_t slices = 0, bytes = 0;
    ASSERT_TRUE(store_->Install(OneKeyMap(7, 4), &slices, &bytes).ok());
  }
  void Frame(int32_t worker, const std::vector<uint8_t>& bytes, Got* got) {
    auto chunks = Split(bytes, 7);
    wire::RequestHeader h;
    uint64_t id;
    ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
    store_->Handle(worker, h, chunks, got->reply());
  }
  // Replays worker `w`'s push of `step`; expects OK.
  void Replay(int32_t w, int64_t step, const std::vector<float>& g) {
    Got got;
    Frame(w, ReplayBytes(RequestBytes(wire::Op::kPush, 7, 0, step, g), 7, 0, step), &got);
    ASSERT_TRUE(got.called);
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  }
  void End(int32_t w, int64_t count) {
    Got got;
    Frame(w, ReplayBytes({}, 0, 0, count), &got);
    ASSERT_TRUE(got.called && got.status.ok()) << got.status.ToString();
  }
  void Send(int32_t w, wire::Op op, int64_t step, std::vector<float> v, Got* got) {
    Frame(w, RequestBytes(op, 7, 0, step, v), got);
  }
  std::unique_ptr<SliceStore> store_;
};

// Workers one step apart: worker 0 pushed 5 and 6, worker 1 pushed 4 and 5. Step 5 is the
// newest with both, worker 0's step 6 is the accumulator; a pull waits for the rebuild.
TEST_F(RebuildTest, WorkersOneStepApartRebuildCompleteAndAccumulator) {
  Make(2);
  Replay(0, 6, {6, 6, 6, 6});
  Got early;
  Send(1, wire::Op::kPull, 5, {}, &early);
  EXPECT_FALSE(early.called);  // the store is rebuilding
  EXPECT_TRUE(store_->Rebuilding());
  Replay(1, 4, {4, 0, 0, 0});
  Replay(1, 5, {1, 2, 3, 4});
  Replay(0, 5, {10, 20, 30, 40});
  End(0, 2);
  EXPECT_FALSE(early.called);  // worker 1 has not ended its replays
  End(1, 2);
  EXPECT_FALSE(store_->Rebuilding());
  ASSERT_TRUE(early.called);
  ASSERT_TRUE(early.status.ok()) << early.status.ToString();
  EXPECT_EQ(early.values, (std::vector<float>{11, 22, 33, 44}));
  EXPECT_EQ(store_->CompleteStep(7, 0), 5);
  Got six;
  Send(1, wire::Op::kPushPull, 6, {1, 1, 1, 1}, &six);
  ASSERT_TRUE(six.called && six.status.ok()) << six.status.ToString();
  EXPECT_EQ(six.values, (std::vector<float>{7, 7, 7, 7}));
  // Step 4 is older than complete-1: dropped, its pull is out of the window.
  Got four;
  Send(0, wire::Op::kPull, 4, {}, &four);
  EXPECT_EQ(four.status.code(), StatusCode::kOutOfRange);
}

// A restarted server rebuilding while a worker is lost for good (docs/elastic.md#what-survives-what):
// the lost worker never replays, so the rebuild does not wait for it, leaves out what it had
// replayed, completes the steps with the others and does not await it afterwards. Learnt before
// the rebuild (the scheduler's first ping) or during it.
TEST_F(RebuildTest, ALostWorkerIsNotWaitedForAndLeftOutOfTheRebuiltSteps) {
  for (const bool before : {true, false}) {
    Make(3);
    if (before) ASSERT_TRUE(store_->LoseWorker(1, 1).ok());
    Replay(0, 5, {1, 1, 1, 1});
    Replay(2, 5, {2, 2, 2, 2});
    Replay(0, 6, {3, 3, 3, 3});
    if (!before) Replay(1, 5, {100, 100, 100, 100});  // it replayed some, then was lost
    Got pull;
    Send(2, wire::Op::kPull, 5, {}, &pull);
    End(0, 2);
    End(2, 1);
    EXPECT_EQ(store_->Rebuilding(), !before) << "without the loss it waits for worker 1";
    if (!before) ASSERT_TRUE(store_->LoseWorker(1, 1).ok());
    EXPECT_FALSE(store_->Rebuilding());
    ASSERT_TRUE(pull.called);
    ASSERT_TRUE(pull.status.ok()) << pull.status.ToString();
    EXPECT_EQ(pull.values, (std::vector<float>{3, 3, 3, 3})) << "worker 1's replay left out";
    EXPECT_EQ(store_->CompleteStep(7, 0), 5);
    // Step 6 completes with worker 2's push: worker 1 is not awaited.
    Got six;
    Send(2, wire::Op::kPushPull, 6, {1, 1, 1, 1}, &six);
    ASSERT_TRUE(six.called && six.status.ok()) << six.status.ToString();
    EXPECT_EQ(six.values, (std::vector<float>{4, 4, 4, 4}));
  }
}

// The end of a worker's replays may overtake them (a server serves by priority): the rebuild
// waits until the announced count arrived. Duplicates count once.
TEST_F(RebuildTest, EndBeforeReplaysAndDuplicates) {
  Make(2);
  End(0, 2);
  End(1, 1);
  Replay(1, 3, {1, 1, 1, 1});
  EXPECT_TRUE(store_->Rebuilding());
  Replay(0, 3, {2, 2, 2, 2});
  Replay(0, 3, {2, 2, 2, 2});  // the same push again: ignored
  EXPECT_FALSE(store_->Rebuilding());
  Got three;
  Send(0, wire::Op::kPull, 3, {}, &three);
  ASSERT_TRUE(three.status.ok()) << three.status.ToString();
  EXPECT_EQ(three.values, (std::vector<float>{3, 3, 3, 3}));
}

// A worker's pushes after its replays continue the protocol while the others still replay; a
// pushpull waits for its step like any pull.
TEST_F(RebuildTest, NewPushesMixWithReplays) {
  Make(2);
  Replay(0, 1, {1, 1, 1, 1});
  Replay(0, 2, {2, 2, 2, 2});
  End(0, 2);
  Got w0;  // worker 0 pulls step 2, pushed before the crash
  Send(0, wire::Op::kPull, 2, {}, &w0);
  Replay(1, 1, {10, 10, 10, 10});
  Got w1;  // worker 1 pushes 2 normally before it ended its replays
  Send(1, wire::Op::kPushPull, 2, {20, 20, 20, 20}, &w1);
  EXPECT_FALSE(w0.called || w1.called);
  End(1, 1);
  ASSERT_TRUE(w0.called && w1.called);
  ASSERT_TRUE(w0.status.ok() && w1.status.ok()) << w0.status.ToString() << w1.status.ToString();
  EXPECT_EQ(w0.values, (std::vector<float>{22, 22, 22, 22}));
  EXPECT_EQ(w1.values, w0.values);
  EXPECT_EQ(store_->CompleteStep(7, 0), 2);
}

// Compressed pushes are replayed as the 2-bit frame that was sent.
TEST_F(RebuildTest, TwoBitReplays) {
  Make(2);
  std::vector<float> g = {0.7f, -0.9f, 0.1f, 2.0f}, residual(4, 0.0f);
  std::vector<uint8_t> frame(TwoBitEncodedBytes(4));
  ASSERT_TRUE(TwoBitEncode(g.data(), residual.data(), 4, 0.5f, frame.data(), frame.size()).ok());
  wire::RequestHeader h;
  h.op = wire::Op::kPushTwoBit;
  h.key = 7;
  h.step = 1;
  h.payload_bytes = frame.size();
  std::vector<uint8_t> push(wire::kRequestHeaderBytes);
  wire::EncodeRequestHeader(h, push.data());
  push.insert(push.end(), frame.begin(), frame.end());
  Got r;
  Frame(0, ReplayBytes(push, 7, 0, 1), &r);
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Replay(1, 1, {1, 1, 1, 1});
  End(0, 1);
  End(1, 1);
  Got one;
  Send(1, wire::Op::kPull, 1, {}, &one);
  ASSERT_TRUE(one.status.ok()) << one.status.ToString();
  EXPECT_EQ(one.values, (std::vector<float>{1.5f, 0.5f, 1, 1.5f}));
  // A request that accepts a packed answer gets the rebuilt result as float32 values.
  Got packed;
  Send(0, wire::Op::kPullPacked, 1, {}, &packed);
  ASSERT_TRUE(packed.status.ok()) << packed.status.ToString();
  EXPECT_EQ(packed.values, one.values);
  EXPECT_TRUE(packed.packed.empty());
}

// A replay must carry the push it names, and a push at that.
TEST_F(RebuildTest, MismatchedReplayIsRefused) {
  Make(1);
  Got bad;
  Frame(0, ReplayBytes(RequestBytes(wire::Op::kPush, 7, 0, 4, {1, 1, 1, 1}), 7, 0, 5), &bad);
  EXPECT_EQ(bad.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status.message(),
            "replay of key 7 slice 0 step 5 carries a push of key 7 slice 0 step 4, not that push");
  Got pull;
  Frame(0, ReplayBytes(RequestBytes(wire::Op::kPull, 7, 0, 5, {}), 7, 0, 5), &pull);
  EXPECT_EQ(pull.status.code(), StatusCode::kInvalidArgument);
}

// On a live server (a worker's connection broke, the server did not) replays of counted
// pushes change nothing, and a push the server never got is counted.
TEST_F(RebuildTest, LiveServerCountsOnlyLostPushes) {
  Make(2);
  for (int64_t step = 1; step <= 3; ++step) {
    Got a, b;
    Send(0, wire::Op::kPush, step, {1, 1, 1, 1}, &a);
    Send(1, wire::Op::kPush, step, {1, 1, 1, 1}, &b);
  }
  Replay(1, 2, {9, 9, 9, 9});
  Replay(1, 3, {9, 9, 9, 9});
  Replay(1, 4, {5, 5, 5, 5});  // lost on the way before: counted now
  End(1, 3);
  EXPECT_FALSE(store_->Rebuilding());
  Got three;
  Send(0, wire::Op::kPull, 3, {}, &three);
  EXPECT_EQ(three.values, (std::vector<float>{2, 2, 2, 2}));
  Got four;
  Send(0, wire::Op::kPushPull, 4, {1, 1, 1, 1}, &four);
  ASSERT_TRUE(four.status.ok()) << four.status.ToString();
  EXPECT_EQ(four.values, (std::vector<float>{6, 6, 6, 6}));
}

// Update mode without a checkpoint path cannot recover the weights: every replay says so.
TEST_F(RebuildTest, UpdateModeWithoutCheckpointFailsClearly) {
  Make(1, ServerMode::kUpdate);
  Got r;
  Frame(0, ReplayBytes(RequestBytes(wire::Op::kPush, 7, 0, 3, {1, 1, 1, 1}), 7, 0, 3), &r);
  EXPECT_EQ(r.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status.message().find("no checkpoint.path"), std::string::npos)
      << r.status.message();
}

// Update mode: the newest checkpoint is reloaded and replayed steps after it are applied on top;
// steps the checkpoint already holds are not applied twice.
TEST_F(RebuildTest, UpdateModeAppliesReplaysOnTopOfTheCheckpoint) {
  char tmpl[] = "/tmp/trellis-rebuild-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Make(1, ServerMode::kUpdate, dir);
  Got g;
  Send(0, wire::Op::kInit, 0, {1, 2, 3, 4}, &g);
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &g);
  Send(0, wire::Op::kPushPull, 2, {2, 0, 0, 2}, &g);
  {
    CheckpointDir d(dir, "server-0", 3);
    ASSERT_TRUE(d.Save(store_->Snapshot(2, /*skip_key=*/99)).ok());
  }
  Got want;
  Send(0, wire::Op::kPushPull, 3, {0, 4, 0, 4}, &want);  // what an undisturbed server answers
  ASSERT_TRUE(want.status.ok()) << want.status.ToString();

  Make(1, ServerMode::kUpdate, dir);  // the restarted server
  Replay(0, 2, {2, 0, 0, 2});  // in the checkpoint already
  Replay(0, 3, {0, 4, 0, 4});
  End(0, 2);
  Got three;
  Send(0, wire::Op::kPull, 3, {}, &three);
  ASSERT_TRUE(three.status.ok()) << three.status.ToString();
  EXPECT_EQ(three.values, want.values);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trellis
