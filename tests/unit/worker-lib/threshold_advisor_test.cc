// ThresholdAdvisor: the 2-bit threshold against the gradients it compresses, said once.
#include "worker-lib/src/threshold_advisor.h"

#include <cmath>
#include <limits>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trellis {
namespace {

using ::testing::HasSubstr;

TEST(ThresholdAdvisor, ATooLargeThresholdIsNamedWithTheGradientsScale) {
  ThresholdAdvisor advisor(0.5);
  std::vector<float> g(1000, 0.004f), h(10, -0.001f);
  // The first compressed step's pushes (several keys) are measured; nothing is said yet.
  EXPECT_EQ(advisor.Observe(1, g.data(), g.size()), "");
  EXPECT_EQ(advisor.Observe(1, h.data(), h.size()), "");
  const std::string advice = advisor.Observe(2, g.data(), g.size());
  // mean |g| = (1000 * 0.004 + 10 * 0.001) / 1010 = 0.00397
  EXPECT_THAT(advice, HasSubstr("threshold 0.5 is 126x the mean |gradient element| (0.004)"));
  EXPECT_THAT(advice, HasSubstr("set it near 0.004 or below"));
  EXPECT_THAT(advice, HasSubstr("spec.compression.threshold"));
  // Once.
  EXPECT_EQ(advisor.Observe(3, g.data(), g.size()), "");
}

TEST(ThresholdAdvisor, ATinyThresholdIsNamedToo) {
  ThresholdAdvisor advisor(1e-6);
  std::vector<float> g(64, 0.01f);
  EXPECT_EQ(advisor.Observe(5, g.data(), g.size()), "");
  EXPECT_THAT(advisor.Observe(6, g.data(), g.size()), HasSubstr("a very small step: set it near 0.01"));
}

TEST(ThresholdAdvisor, AThresholdNearTheGradientsSaysNothing) {
  for (float scale : {0.02f, 0.1f, 1.0f, 9.0f}) {  // threshold / mean from 5 to 0.011
    ThresholdAdvisor advisor(0.1);
    std::vector<float> g(256, scale);
    g[3] = -scale;
    EXPECT_EQ(advisor.Observe(1, g.data(), g.size()), "");
    EXPECT_EQ(advisor.Observe(2, g.data(), g.size()), "") << scale;
  }
  for (float scale : {0.011f, 5.0f}) {  // 9x and 0.02x: inside the bounds
    ThresholdAdvisor advisor(0.1);
    std::vector<float> g(16, scale);
    advisor.Observe(1, g.data(), g.size());
    EXPECT_EQ(advisor.Observe(2, g.data(), g.size()), "") << scale;
  }
}

TEST(ThresholdAdvisor, NonFiniteAndZeroGradientsAreNoScale) {
  ThresholdAdvisor zeros(0.5);
  std::vector<float> z(32, 0.0f);
  zeros.Observe(1, z.data(), z.size());
  EXPECT_EQ(zeros.Observe(2, z.data(), z.size()), "");

  ThresholdAdvisor mixed(0.5);
  std::vector<float> g(32, 0.001f);
  g[0] = std::numeric_limits<float>::quiet_NaN();
  g[1] = std::numeric_limits<float>::infinity();
  mixed.Observe(1, g.data(), g.size());
  EXPECT_THAT(mixed.Observe(2, g.data(), g.size()), HasSubstr("(0.001)"));
}

}  // namespace
}  // namespace trellis
