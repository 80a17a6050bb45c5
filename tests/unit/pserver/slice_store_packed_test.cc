// Packed pull answers in the store (docs/compression.md, "Packed pull answers"): which steps
// are answered packed, to whom, and what a bad frame in a packed request gets.
#include <gtest/gtest.h>

#include "tests/unit/pserver/slice_store_fixture.h"
#include "datapath/codec/packed_sum.h"

namespace trellis {
namespace {

using store_testing::Got;
using store_testing::SliceStoreTest;

// Every push of the step a 2-bit frame of one threshold: a request that accepts a packed answer
// gets one (made once, the same bytes for every such request), decoding to the float32 sum;
// a request that does not accept one gets float32.
TEST_F(SliceStoreTest, AllTwoBitStepAnswersPackedToThoseWhoAccept) {
  Make(2);
  Got a, b;
  SendTwoBit(0, wire::Op::kPushPullTwoBitPacked, 1, {0.7f, -0.2f, -3.0f, 0.5f}, &a);
  EXPECT_FALSE(a.called);  // waits for worker 1
  SendTwoBit(1, wire::Op::kPushPullTwoBit, 1, {1, -1, -1, 0}, &b);
  ASSERT_TRUE(a.called && b.called);
  ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.ToString() << b.status.ToString();
  const std::vector<float> sum = {1.0f, -0.5f, -1.0f, 0.5f};
  EXPECT_EQ(b.values, sum);
  EXPECT_TRUE(b.packed.empty());
  ASSERT_EQ(a.packed.size(), PackedSumBytes(4, 4));  // W = 2: 4 bits per element
  std::vector<float> decoded(4);
  ASSERT_TRUE(UnpackSum(a.packed.data(), a.packed.size(), 4, decoded.data()).ok());
  EXPECT_EQ(decoded, sum);
  // A later pull of the kept step: the same packed bytes; a plain pull: float32.
  Got c, d;
  Send(0, wire::Op::kPullPacked, 1, {}, &c);
  Send(1, wire::Op::kPull, 1, {}, &d);
  ASSERT_TRUE(c.status.ok() && d.status.ok());
  EXPECT_EQ(c.packed, a.packed);
  EXPECT_TRUE(d.packed.empty());
  EXPECT_EQ(d.values, sum);
}

// Any float32 push in the step (warm-up, a key with allow_compression = false), or pushes of two
// thresholds: the answer is float32 even to a request that accepts a packed one.
TEST_F(SliceStoreTest, MixedStepsAnswerFloat32) {
  Make(2);
  Got a, b;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a);
  SendTwoBit(1, wire::Op::kPushPullTwoBitPacked, 1, {0.7f, -0.2f, -3.0f, 0.5f}, &b);
  ASSERT_TRUE(b.status.ok()) << b.status.ToString();
  EXPECT_TRUE(b.packed.empty());
  EXPECT_EQ(b.values, (std::vector<float>{1.5f, 2, 2.5f, 4.5f}));
  Got c, d;
  SendTwoBit(0, wire::Op::kPushPullTwoBitPacked, 2, {1, 1, 1, 1}, &c, {}, 0.5f);
  SendTwoBit(1, wire::Op::kPushPullTwoBitPacked, 2, {1, 1, 1, 1}, &d, {}, 0.25f);
  ASSERT_TRUE(c.status.ok() && d.status.ok());
  EXPECT_TRUE(c.packed.empty() && d.packed.empty());
  EXPECT_EQ(d.values, (std::vector<float>{0.75f, 0.75f, 0.75f, 0.75f}));
  // The next step is all 2-bit again: packed.
  Got e, f;
  SendTwoBit(0, wire::Op::kPushPullTwoBitPacked, 3, {1, 1, 1, 1}, &e);
  SendTwoBit(1, wire::Op::kPushPullTwoBitPacked, 3, {-1, 1, 1, 1}, &f);
  EXPECT_FALSE(e.packed.empty());
  EXPECT_EQ(e.packed, f.packed);
}

// 8 workers do not fit 4 bits (|k| <= 8): the answer takes 8 bits per element.
TEST_F(SliceStoreTest, EightWorkersAnswerEightBitsPerElement) {
  Make(8);
  std::vector<Got> got(8);
  for (int32_t w = 0; w < 8; ++w) {
    SendTwoBit(w, wire::Op::kPushPullTwoBitPacked, 1, {1, -1, w < 4 ? 1.0f : -1.0f, 0}, &got[w]);
  }
  for (const Got& g : got) ASSERT_TRUE(g.called && g.status.ok()) << g.status.ToString();
  ASSERT_EQ(got[0].packed.size(), PackedSumBytes(4, 8));
  EXPECT_EQ(got[0].packed[6], 8);  // the bits field
  std::vector<float> decoded(4);
  ASSERT_TRUE(UnpackSum(got[0].packed.data(), got[0].packed.size(), 4, decoded.data()).ok());
  EXPECT_EQ(decoded, (std::vector<float>{4, -4, 0, 0}));
  EXPECT_EQ(decoded, got[7].values);
  EXPECT_EQ(got[7].packed, got[0].packed);
}

// Update mode answers weights, never a sum of pushes: float32.
TEST_F(SliceStoreTest, UpdateModeAnswersFloat32ToPackedRequests) {
  OptimizerSpec sgd;
  sgd.learningRate = 0.5;
  Make(1, ServerMode::kUpdate, sgd);
  Got i0, a;
  Send(0, wire::Op::kInit, 0, {1, 1, 1, 1}, &i0);
  SendTwoBit(0, wire::Op::kPushPullTwoBitPacked, 1, {1, 1, -1, 0}, &a);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  EXPECT_TRUE(a.packed.empty());
  EXPECT_EQ(a.values, (std::vector<float>{0.75f, 0.75f, 1.25f, 1}));
}

TEST_F(SliceStoreTest, BadFrameInAPackedPushPullIsRefused) {
  Make(1);
  Got good = BadFrameIsRefusedAndDoesNotCount(
      wire::Op::kPushPullTwoBitPacked, std::vector<uint8_t>(20, 0),
      "key 7 (w) slice 0: pushpull2bitpacked: 2bit frame: bad magic 0x00000000, want "
      "0x42325254 (\"TR2B\")");
  EXPECT_FALSE(good.packed.empty());
}

}  // namespace
}  // namespace trellis
