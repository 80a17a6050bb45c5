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
  StatusOr<int64_t> Setup(Mlp&, std::vector<std::vector<float>>&, std::vector<float>&) override {
    setup_called = true;
    return int64_t{0};
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

namespace trellis::mlp {
namespace {

// One process whose "checkpoint directory" is memory: what TrellisExchange does with
// trellis::Checkpointer, without a cluster, so the trainer's resume logic is pinned down alone.
class MemoryCheckpointExchange : public LocalExchange {
 public:
  struct Saved {
    int64_t step = 0;
    std::vector<std::vector<float>> params, velocity;
    std::vector<float> position;
  };
  MemoryCheckpointExchange(int64_t interval, Saved* store) : interval_(interval), store_(store) {}
  StatusOr<int64_t> Setup(Mlp& model, std::vector<std::vector<float>>& velocity,
                          std::vector<float>& position) override {
    model_ = &model;
    velocity_ = &velocity;
    position_ = &position;
    if (store_->step == 0) return int64_t{0};
    position = store_->position;
    for (int l = 0; l < model.num_layers(); ++l) {
      std::copy(store_->params[l].begin(), store_->params[l].end(), model.params(l));
    }
    velocity = store_->velocity;
    return store_->step;
  }
  bool CheckpointDue(int64_t step) const override { return step % interval_ == 0; }
  Status SaveCheckpoint(int64_t step) override {
    store_->step = step;
    store_->params.clear();
    for (int l = 0; l < model_->num_layers(); ++l) {
      store_->params.emplace_back(model_->params(l), model_->params(l) + model_->layer_size(l));
    }
    store_->velocity = *velocity_;
    store_->position = *position_;
    ++saves;
    return Status::Ok();
  }
  int saves = 0;

 private:
  const int64_t interval_;
  Saved* store_;
  Mlp* model_ = nullptr;
  std::vector<std::vector<float>>* velocity_ = nullptr;
  std::vector<float>* position_ = nullptr;
};

// Save -> stop -> restore into a freshly initialised model -> continue ends bit for bit where an
// uninterrupted run ends, with the restore point in the middle of an epoch.
TEST(TrainerTest, ResumeFromACheckpointMidEpochEqualsAnUninterruptedRun) {
  TrainOptions o = SmallOptions();
  o.epochs = 3;
  o.train_samples = 2048;  // 64 steps per epoch
  MemoryCheckpointExchange::Saved unused;
  MemoryCheckpointExchange plain(1 << 30, &unused);
  Mlp whole(o.sizes);
  auto full = Train(o, plain, whole, {});
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  ASSERT_EQ(full->steps, 3 * 64);

  MemoryCheckpointExchange::Saved store;
  TrainOptions first = o;
  first.stop_at_step = 80;  // epoch 2, step 16
  MemoryCheckpointExchange saving(40, &store);
  Mlp part(o.sizes);
  auto a = Train(first, saving, part, {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->stopped);
  EXPECT_EQ(a->steps, 80);
  EXPECT_EQ(saving.saves, 2);
  EXPECT_EQ(store.step, 80);
  // Stopped early: said so, with a real throughput (it read "accuracy 0.0% -- MISSED" and
  // "6400000000000 samples/s", the partial epoch's time left out).
  const std::string result = FormatResult(first, *a);
  EXPECT_NE(result.find("(after the last full epoch; stopped early"), std::string::npos) << result;
  EXPECT_GT(a->train_seconds, 0.0);
  EXPECT_LT(a->samples_per_second, 1e8) << result;
  TrainOptions early = o;
  early.stop_at_step = 10;  // inside epoch 1: nothing evaluated
  MemoryCheckpointExchange none(1 << 30, &unused);
  Mlp tiny(o.sizes);
  auto e = Train(early, none, tiny, {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::string early_result = FormatResult(early, *e);
  EXPECT_NE(early_result.find("RESULT: stopped early after step 10 as asked (--stop-at-step), before any epoch "
                              "ended: no test accuracy measured"),
            std::string::npos)
      << early_result;
  EXPECT_EQ(early_result.find("MISSED"), std::string::npos) << early_result;
  EXPECT_FALSE(e->reached_target);
  EXPECT_LT(e->samples_per_second, 1e8) << early_result;

  TrainOptions second = o;
  second.seed = o.seed;  // the fresh model starts from its own random init, then restores
  MemoryCheckpointExchange resuming(40, &store);
  Mlp resumed(o.sizes);
  std::ostringstream out;
  auto b = Train(second, resuming, resumed, {&out, false});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->resumed_after, 80);
  EXPECT_EQ(b->steps, 3 * 64 - 80);
  EXPECT_NE(out.str().find("resuming after step 80"), std::string::npos) << out.str();
  EXPECT_EQ(AllParams(resumed), AllParams(whole));  // bit for bit
  EXPECT_EQ(b->test_accuracy, full->test_accuracy);
}

// A finished job started again (the same job file run again; its newest checkpoint is its last
// step) trains nothing and reports the restored model: it used to report "test accuracy 0.0% --
// MISSED" and exit 1.
TEST(TrainerTest, FinishedJobStartedAgainReportsItsModelAndTrainsNothing) {
  TrainOptions o = SmallOptions();
  o.epochs = 2;
  o.train_samples = 2048;  // 64 steps per epoch
  MemoryCheckpointExchange::Saved store;
  MemoryCheckpointExchange saving(64, &store);
  Mlp first(o.sizes);
  auto done = Train(o, saving, first, {});
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  ASSERT_EQ(store.step, 2 * 64);

  MemoryCheckpointExchange again(64, &store);
  Mlp restored(o.sizes);
  std::ostringstream out;
  auto r = Train(o, again, restored, {&out, false});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->already_finished);
  EXPECT_EQ(r->steps, 0);
  EXPECT_EQ(again.saves, 0);
  EXPECT_EQ(AllParams(restored), AllParams(first));
  EXPECT_EQ(r->test_accuracy, done->test_accuracy);
  EXPECT_EQ(r->reached_target, done->reached_target);
  EXPECT_NE(out.str().find("nothing left to train"), std::string::npos) << out.str();
  const std::string result = FormatResult(o, *r);
  EXPECT_NE(result.find("the job had already finished"), std::string::npos) << result;

  // The same after a run stopped at --stop-at-step: started again with the same option, it
  // does not train past the step it was asked to stop at.
  TrainOptions stop = o;
  stop.stop_at_step = 80;
  MemoryCheckpointExchange::Saved at80;
  MemoryCheckpointExchange save80(40, &at80);
  Mlp part(o.sizes);
  ASSERT_TRUE(Train(stop, save80, part, {}).ok());
  ASSERT_EQ(at80.step, 80);
  MemoryCheckpointExchange again80(40, &at80);
  Mlp part_again(o.sizes);
  auto r80 = Train(stop, again80, part_again, {});
  ASSERT_TRUE(r80.ok()) << r80.status().ToString();
  EXPECT_EQ(r80->steps, 0);
  EXPECT_EQ(AllParams(part_again), AllParams(part));
}

}  // namespace
}  // namespace trellis::mlp
