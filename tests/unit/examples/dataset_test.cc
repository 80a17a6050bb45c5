#include "examples/mlp/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace trellis::mlp {
namespace {

TEST(DatasetTest, LabelsAreTheTeachersArgmaxWithTheRequiredMargin) {
  TaskOptions task;
  const Dataset set = MakeTestSet(task, 500);
  const Teacher teacher(task);
  std::vector<float> logits(task.classes);
  for (int64_t i = 0; i < set.size; ++i) {
    ASSERT_EQ(set.y[i], teacher.Label(set.row(i)));
    teacher.Logits(set.row(i), logits.data());
    std::sort(logits.begin(), logits.end(), std::greater<float>());
    ASSERT_GE(logits[0] - logits[1], task.min_margin);
  }
}

TEST(DatasetTest, ClassesAreRoughlyBalanced) {
  TaskOptions task;
  const Dataset set = MakeTrainSet(task, 5000);
  std::vector<int> count(task.classes, 0);
  for (int32_t y : set.y) ++count[y];
  for (int c = 0; c < task.classes; ++c) {
    // Uniform would be 500 each; without the bias calibration some classes get almost none.
    EXPECT_GT(count[c], 200) << "class " << c;
    EXPECT_LT(count[c], 1000) << "class " << c;
  }
}

TEST(DatasetTest, SameSeedSameDataOtherSeedOtherData) {
  TaskOptions task;
  const Dataset a = MakeTrainSet(task, 100);
  const Dataset b = MakeTrainSet(task, 100);
  EXPECT_EQ(a.x, b.x);
  EXPECT_EQ(a.y, b.y);
  task.seed = 8;
  EXPECT_NE(MakeTrainSet(task, 100).x, a.x);
  // Train and test come from different streams.
  EXPECT_NE(MakeTestSet(TaskOptions{}, 100).x, a.x);
}

TEST(DatasetTest, ShardsAreEqualDisjointSlices) {
  TaskOptions task;
  const Dataset full = MakeTrainSet(task, 101);
  const Dataset s0 = Shard(full, 0, 2);
  const Dataset s1 = Shard(full, 1, 2);
  ASSERT_EQ(s0.size, 50);
  ASSERT_EQ(s1.size, 50);  // the odd sample is dropped so both run the same steps
  EXPECT_TRUE(std::equal(s0.x.begin(), s0.x.end(), full.x.begin()));
  EXPECT_TRUE(std::equal(s1.x.begin(), s1.x.end(), full.x.begin() + 50 * full.dim));
  EXPECT_EQ(s1.y[0], full.y[50]);
}

TEST(DatasetTest, LinearTeacherAndFullDimensionalInputsWork) {
  TaskOptions task;
  task.teacher_hidden = 0;
  task.latent_dim = 0;
  task.min_margin = 0;
  const Dataset set = MakeTrainSet(task, 200);
  const Teacher teacher(task);
  for (int64_t i = 0; i < set.size; ++i) ASSERT_EQ(set.y[i], teacher.Label(set.row(i)));
}

}  // namespace
}  // namespace trellis::mlp
