// Command-line and environment settings of trellis-mlp (flag > environment > default).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "examples/mlp/dataset.h"

namespace trellis::mlp {

struct TrainOptions {
  std::vector<int64_t> sizes = {64, 1024, 768, 256, 10};  // input, hidden..., classes
  int32_t epochs = 3;
  int64_t batch = 64;              // per worker per step
  double lr = 0.03;
  double momentum = 0.9;
  uint64_t seed = 1;               // initial weights and shuffling
  double target_accuracy = 0.90;   // fraction; the exit code says whether it was reached
  int64_t train_samples = 32768;   // whole training set, split across workers
  int64_t test_samples = 2048;
  TaskOptions task;
  int64_t stop_at_step = 0;        // > 0: end after this global step (checkpoint tests)
  int32_t slow_rank = -1;          // this worker rank sleeps step_sleep_ms per step (stragglers)
  int64_t step_sleep_ms = 0;
  bool local = false;              // train in this process without Trellis
  bool help = false;
};

// Parses argv (argv[0] skipped). Each option is also read from the environment as
// TRELLIS_MLP_<NAME> (e.g. TRELLIS_MLP_EPOCHS=3); a flag wins over the environment.
// Errors name the flag and the bad value.
StatusOr<TrainOptions> ParseTrainOptions(const std::vector<std::string>& args);

std::string TrainUsage();

}  // namespace trellis::mlp
