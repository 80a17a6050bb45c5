#include "examples/mlp/trainer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <vector>

namespace trellis::mlp {
namespace {

// A small version of the demo: trains in about a second.
TrainOptions SmallOptions() {
  TrainOptions o;
  o.sizes = {16, 128, 64, 10};
  o.task.input_dim = 16;
  o.task.latent_dim = 8;
  o.task.teacher_hidden = 16;
  o.epochs = 3;
  o.batch = 32;
  o.train_samples = 8192;
  o.test_samples = 1000;
  o.target_accuracy = 0.90;
  o.lr = 0.02;
  return o;
}

std::vector<float> AllParams(const Mlp& model) {
  std::vector<float> all;
  for (int l = 0; l < model.num_layers(); ++l) {
    all.insert(all.end(), model.params(l), model.params(l) + model.layer_size(l));
  }
  return all;
}

TEST(TrainerTest, LocalTrainingReachesTheTargetInSeconds) {
  const TrainOptions o = SmallOptions();
  LocalExchange local;
  Mlp model(o.sizes);
  std::ostringstream out;
  const auto start = std::chrono::steady_clock::now();
  auto report = Train(o, local, model, {&out, false});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_GE(report->test_accuracy, 0.90) << out.str();
  EXPECT_TRUE(report->reached_target);
  EXPECT_LT(report->epochs.back().train_loss, report->epochs.front().train_loss);
  EXPECT_EQ(report->steps, 3 * (8192 / 32));
  EXPECT_LT(secs, 30.0);
  // Non-TTY output: one line per epoch, then the RESULT block; no carriage returns.
  const std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("epoch 3/3"), std::string::npos);
  EXPECT_NE(text.find("RESULT: test accuracy"), std::string::npos) << text;
  EXPECT_NE(text.find("-- reached"), std::string::npos) << text;
}

TEST(TrainerTest, MissedTargetIsReported) {
  TrainOptions o = SmallOptions();
  o.epochs = 1;
  o.train_samples = 256;
  o.target_accuracy = 0.999;
  LocalExchange local;
  Mlp model(o.sizes);
  std::ostringstream out;
  auto report = Train(o, local, model, {&out, false});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_FALSE(report->reached_target);
  EXPECT_NE(out.str().find("MISSED"), std::string::npos);
}

TEST(TrainerTest, SameSeedSameWeightsOtherSeedOtherWeights) {
  TrainOptions o = SmallOptions();
  o.epochs = 1;
  o.train_samples = 2048;
  auto run = [&](uint64_t seed) {
    TrainOptions oo = o;
    oo.seed = seed;
    LocalExchange local;
    Mlp model(oo.sizes);
    auto report = Train(oo, local, model, {});
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return AllParams(model);
  };
  const auto a = run(3);
  const auto b = run(3);
  const auto c = run(4);
  EXPECT_EQ(a, b);  // bit for bit
  EXPECT_NE(a, c);
}

// Pretends to be rank 0 of two workers whose peer computed the very same gradient: the sum is
// twice the gradient and the trainer must divide by the worker count. Checks the overlap
// protocol on the way: gradients start last layer first with priority -layer, stay untouched
// while in flight, and each layer is waited for exactly once per start.
class MirrorExchange : public Exchange {
 public:
  explicit MirrorExchange(int layers) : in_flight_(layers, nullptr), checksum_(layers, 0) {}
  int rank() const override { return 0; }
  int world() const override { return 2; }
  Status Setup(Mlp&) override {
    setup_called = true;
    return Status::Ok();
  }
  void Start(int layer, float* grad, int priority) override {
    if (in_flight_[layer] != nullptr) errors.push_back("layer started twice");
    if (priority != -layer) errors.push_back("priority is not -layer");
    if (!started.empty() && started.back() != layer + 1 && layer != num_layers() - 1) {
      errors.push_back("layers did not start last-first");
    }
    started.push_back(layer);
    in_flight_[layer] = grad;
    checksum_[layer] = Sum(layer);
  }
  Status Wait(int layer) override {
    if (in_flight_[layer] == nullptr) {
      errors.push_back("wait without start");
      return Status::Ok();
    }
    if (Sum(layer) != checksum_[layer]) errors.push_back("gradient changed while in flight");
    const int64_t n = sizes_[layer];
    for (int64_t i = 0; i < n; ++i) in_flight_[layer][i] *= 2.0f;
    in_flight_[layer] = nullptr;
    ++waits;
    return Status::Ok();
  }
  StatusOr<std::vector<double>> SumStats(const std::vector<double>& v) override {
    std::vector<double> twice = v;
    for (double& x : twice) x *= 2;
    return twice;
  }
  uint64_t bytes_pushed() const override { return 100; }
  uint64_t bytes_pulled() const override { return 50; }

  void set_sizes(const Mlp& model) {
    for (int l = 0; l < model.num_layers(); ++l) sizes_.push_back(model.layer_size(l));
  }

  bool setup_called = false;
  std::vector<int> started;
  int waits = 0;
  std::vector<std::string> errors;

 private:
  int num_layers() const { return static_cast<int>(in_flight_.size()); }
  double Sum(int layer) const {
    double s = 0;
    for (int64_t i = 0; i < sizes_[layer]; ++i) s += in_flight_[layer][i];
    return s;
  }
  std::vector<float*> in_flight_;
  std::vector<double> checksum_;
  std::vector<int64_t> sizes_;
};

TEST(TrainerTest, TwoIdenticalWorkersTrainLikeOneOnTheSameShard) {
  TrainOptions o = SmallOptions();
  o.epochs = 2;
  o.train_samples = 2048;

  Mlp distributed(o.sizes);
  MirrorExchange mirror(distributed.num_layers());
  mirror.set_sizes(distributed);
  auto report = Train(o, mirror, distributed, {});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(mirror.setup_called);
  EXPECT_TRUE(mirror.errors.empty()) << mirror.errors.front();
  const int64_t steps = 2 * (1024 / 32);
  EXPECT_EQ(static_cast<int64_t>(mirror.started.size()), steps * distributed.num_layers());
  EXPECT_EQ(mirror.waits, steps * distributed.num_layers());
  EXPECT_DOUBLE_EQ(report->bytes_pushed, 200);  // summed over the (mirrored) workers
  EXPECT_EQ(report->world, 2);

  // Rank 0's shard of 2048 samples is the first 1024, exactly what a 1024-sample local run sees.
  TrainOptions local_options = o;
  local_options.train_samples = 1024;
  LocalExchange local;
  Mlp alone(o.sizes);
  ASSERT_TRUE(Train(local_options, local, alone, {}).ok());
  EXPECT_EQ(AllParams(distributed), AllParams(alone));
}

class FailingExchange : public LocalExchange {
 public:
  Status Wait(int layer) override {
    return layer == 1 ? UnavailableError("server 0 went away") : Status::Ok();
  }
};

TEST(TrainerTest, CommunicationErrorsStopTrainingWithContext) {
  TrainOptions o = SmallOptions();
  FailingExchange failing;
  Mlp model(o.sizes);
  auto report = Train(o, failing, model, {});
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(report.status().message().find("layer 1: server 0 went away"), std::string::npos)
      << report.status().message();
}

TEST(TrainerTest, TooFewSamplesForABatchIsAClearError) {
  TrainOptions o = SmallOptions();
  o.train_samples = 10;
  LocalExchange local;
  Mlp model(o.sizes);
  auto report = Train(o, local, model, {});
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(report.status().message().find("fewer than --batch 32"), std::string::npos)
      << report.status().message();
}

TEST(TrainerTest, ModelShapeMustMatchOptions) {
  TrainOptions o = SmallOptions();
  LocalExchange local;
  Mlp model({16, 8, 10});
  EXPECT_EQ(Train(o, local, model, {}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trellis::mlp
