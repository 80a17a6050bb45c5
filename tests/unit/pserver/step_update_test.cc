// A complete step's result (pserver/step_update.h) and the two results a slice keeps
// (KeptResults, pserver/slice.h).
#include "pserver/step_update.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

namespace trellis {
namespace {

StoreConfig Config(ServerMode mode, int32_t workers, OptimizerSpec optimizer = {}) {
  StoreConfig c;
  c.mode = mode;
  c.num_workers = workers;
  c.optimizer = optimizer;
  return c;
}

// Aggregate mode publishes the sum itself: the buffer becomes the result, not a copy.
TEST(StepUpdateTest, AggregateTakesTheSumAsTheResult) {
  const StepUpdate update(Config(ServerMode::kAggregate, 2));
  auto sum = std::make_unique<std::vector<float>>(std::vector<float>{1, 2, 3});
  const std::vector<float>* buffer = sum.get();
  SliceWeights w;
  Values r = update.Apply(4, 2, &sum, &w);
  EXPECT_EQ(r.get(), buffer);
  EXPECT_EQ(*r, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(sum, nullptr);
  EXPECT_TRUE(w.values.empty());
}

// Update mode: the optimizer on the mean (sum / W), at optimizer step base + step; the sum stays
// the caller's, scaled to the mean.
TEST(StepUpdateTest, UpdateAppliesTheOptimizerToTheMeanAtBasePlusStep) {
  OptimizerSpec adam;
  adam.type = OptimizerType::kAdam;
  adam.learningRate = 0.1;
  const StepUpdate update(Config(ServerMode::kUpdate, 4, adam));
  SliceWeights w;
  w.values = {1, -2, 0.5f};
  w.step_base = 10;
  SliceWeights want = w;
  const std::vector<float> s = {4, -1, 0.25f};
  std::vector<float> mean = s;
  for (float& x : mean) x *= 1.0f / 4;
  ApplyOptimizer(adam, 13, mean.data(), want.values.data(), 3, &want.opt);

  auto sum = std::make_unique<std::vector<float>>(s);
  Values r = update.Apply(3, 4, &sum, &w);
  EXPECT_EQ(*r, want.values);  // bit for bit
  EXPECT_EQ(w.values, want.values);
  EXPECT_EQ(w.opt.m, want.opt.m);
  EXPECT_EQ(w.opt.v, want.opt.v);
  ASSERT_NE(sum, nullptr);
  EXPECT_EQ(*sum, mean);
  // The published result is a copy: the next step moves the weights on, not an answer in flight.
  update.Apply(4, 2, &sum, &w);
  EXPECT_EQ(*r, want.values);
  EXPECT_NE(w.values, want.values);
}

TEST(KeptResultsTest, KeepsTheLastTwoStepsAndHandsBackTheOneItReplaces) {
  KeptResults kept;
  auto v = [](float x) { return std::make_shared<const std::vector<float>>(1, x); };
  kept.Restart(v(0));
  EXPECT_EQ((*kept.Get(0))[0], 0);
  EXPECT_EQ(kept.Keep(1, v(1), 0), nullptr);
  Values two = v(2);
  Values old = kept.Keep(2, two, 0);
  ASSERT_NE(old, nullptr);
  EXPECT_EQ((*old)[0], 0);  // step 0's, replaced by step 2
  EXPECT_EQ(kept.Get(0), nullptr);
  EXPECT_EQ((*kept.Get(1))[0], 1);
  EXPECT_EQ(kept.Get(2), two);
  EXPECT_EQ(kept.Get(3), nullptr);
  EXPECT_EQ(kept.PackedFor(2), nullptr);  // not a sum of 2-bit pushes
  kept.Restart(v(5));
  EXPECT_EQ(kept.Get(1), nullptr);
  EXPECT_EQ((*kept.Get(0))[0], 5);
  kept.Forget();
  EXPECT_EQ(kept.Get(0), nullptr);
}

}  // namespace
}  // namespace trellis
