// The training-step simulator one bench_p3 worker process runs: forward and backward passes
// that sleep for each layer's compute time, and gradient exchange through trellis::Worker in one
// of three schedules.
#pragma once

#include <string>

#include "bench/p3/models.h"
#include "common/base/status.h"
#include "trellis/trellis.h"

namespace trellis::bench {

enum class Schedule {
  kNoOverlap,  // (a) backward, then push everything, wait for everything, then forward
  kOverlap,    // (b) push each layer as its gradient is ready; wait for everything before forward
  kP3,         // (c) push each layer with priority -layer; wait for layer l just before its forward
};
StatusOr<Schedule> ScheduleByName(const std::string& name);  // "a", "b", "c"
const char* ScheduleName(Schedule s);

struct SimulateOptions {
  Schedule schedule = Schedule::kP3;
  int warmup_steps = 1;
  int steps = 2;
  // Compute times are multiplied by this: at link rate R, dilation D simulates a link of D*R
  // with the real compute times (same ratio of communication to compute).
  double dilation = 1;
};

// Declares the model's keys, runs the steps; returns the mean step time (seconds) after warm-up.
// Every worker must run the same model and options.
StatusOr<double> SimulateTraining(Worker& worker, const Model& model,
                                  const SimulateOptions& options);

}  // namespace trellis::bench
