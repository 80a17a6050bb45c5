#include "examples/mlp/options.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace trellis::mlp {
namespace {

TEST(OptionsTest, DefaultsDescribeTheDemo) {
  auto o = ParseTrainOptions({});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->sizes, (std::vector<int64_t>{64, 1024, 768, 256, 10}));
  EXPECT_EQ(o->batch, 64);
  EXPECT_FALSE(o->local);
}

TEST(OptionsTest, ParsesEveryFlagForm) {
  auto o = ParseTrainOptions({"--epochs", "3", "--batch=32", "--lr", "0.1", "--seed", "9",
                              "--target-accuracy", "85", "--train-samples", "1000", "--local",
                              "--layers", "8,16,3"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->epochs, 3);
  EXPECT_EQ(o->batch, 32);
  EXPECT_DOUBLE_EQ(o->lr, 0.1);
  EXPECT_EQ(o->seed, 9u);
  EXPECT_DOUBLE_EQ(o->target_accuracy, 0.85);  // percent accepted
  EXPECT_EQ(o->train_samples, 1000);
  EXPECT_TRUE(o->local);
  EXPECT_EQ(o->task.input_dim, 8);  // the task follows the model's shape
  EXPECT_EQ(o->task.classes, 3);
}

TEST(OptionsTest, BadValuesGiveClearErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string want;
  };
  const Case cases[] = {
      {{"--epochs", "zero"}, "--epochs: expected an integer >= 1, got 'zero'"},
      {{"--batch", "0"}, "--batch: expected an integer >= 1, got '0'"},
      {{"--lr", "-1"}, "--lr: expected a number in"},
      {{"--lr"}, "--lr: missing value"},
      {{"--frobnicate", "1"}, "unknown flag --frobnicate"},
      {{"stray"}, "unexpected argument 'stray'"},
      {{"--layers", "64"}, "--layers: expected at least"},
      {{"--layers", "8,16,1"}, "must be >= 2"},
  };
  for (const auto& c : cases) {
    auto o = ParseTrainOptions(c.args);
    ASSERT_FALSE(o.ok()) << c.args[0];
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find(c.want), std::string::npos)
        << "got: " << o.status().message();
  }
}

TEST(OptionsTest, EnvironmentIsReadAndFlagsWin) {
  ::setenv("TRELLIS_MLP_EPOCHS", "4", 1);
  ::setenv("TRELLIS_MLP_TRAIN_SAMPLES", "2048", 1);
  auto o = ParseTrainOptions({"--epochs", "2"});
  ::setenv("TRELLIS_MLP_BATCH", "x", 1);
  auto bad = ParseTrainOptions({});
  ::unsetenv("TRELLIS_MLP_EPOCHS");
  ::unsetenv("TRELLIS_MLP_TRAIN_SAMPLES");
  ::unsetenv("TRELLIS_MLP_BATCH");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->epochs, 2);
  EXPECT_EQ(o->train_samples, 2048);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("TRELLIS_MLP_BATCH"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace trellis::mlp
