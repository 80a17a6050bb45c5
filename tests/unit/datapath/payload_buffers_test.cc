#include "datapath/payload_buffers.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

constexpr size_t kSlice = 1 << 18;  // floats in a full slice frame

// A connection's frames: full slices with small bulk frames between them. Once two full-size
// buffers are kept, no frame may grow a buffer again (growth is the zero-fill the pool saves).
TEST(PayloadBuffersTest, SmallFramesBetweenSlicesNeverShrinkTheKeptBuffers) {
  PayloadBuffers pool(2);
  size_t grown = 0;
  auto frame = [&](size_t floats) {
    std::vector<float> b = pool.Take(floats);
    if (b.size() < floats) ++grown;
    PayloadBuffers::Grow(&b, floats);
    EXPECT_GE(b.size(), floats);
    return b;
  };
  // Warm-up: two slices in flight at once.
  auto a = frame(kSlice);
  auto b = frame(kSlice);
  pool.Give(std::move(a));
  pool.Give(std::move(b));
  ASSERT_EQ(grown, 2u);
  for (int step = 0; step < 10; ++step) {
    for (size_t floats : {kSlice, size_t{10}, kSlice, size_t{4096}, kSlice, size_t{1}}) {
      auto x = frame(floats);
      pool.Give(std::move(x));
    }
  }
  EXPECT_EQ(grown, 2u) << "a small frame shrank a kept slice buffer";
  EXPECT_EQ(pool.kept(), 2u);
}

TEST(PayloadBuffersTest, TakesTheSmallestThatFitsSoAnExactSizeIsFoundForTheStoreSwap) {
  PayloadBuffers pool(3);
  pool.Give(std::vector<float>(100));
  pool.Give(std::vector<float>(50));
  pool.Give(std::vector<float>(200));
  EXPECT_EQ(pool.Take(50).size(), 50u);   // exact
  EXPECT_EQ(pool.Take(60).size(), 100u);  // smallest that fits
  EXPECT_EQ(pool.Take(500).size(), 200u); // none fits: the largest (grown by the caller)
  EXPECT_TRUE(pool.Take(1).empty());      // none kept
}

TEST(PayloadBuffersTest, KeepsAtMostKeepBuffersAndPrefersLargeOnes) {
  PayloadBuffers pool(2);
  pool.Give(std::vector<float>(10));
  pool.Give(std::vector<float>(20));
  pool.Give(std::vector<float>(5));    // smaller than both: dropped
  pool.Give(std::vector<float>(30));   // replaces the 10
  pool.Give(std::vector<float>());     // nothing to keep
  EXPECT_EQ(pool.kept(), 2u);
  EXPECT_EQ(pool.Take(1).size(), 20u);
  EXPECT_EQ(pool.Take(1).size(), 30u);
  EXPECT_EQ(pool.kept(), 0u);
}

}  // namespace
}  // namespace trellis
