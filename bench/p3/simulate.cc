#include "bench/p3/simulate.h"

#include <chrono>
#include <thread>
#include <vector>

namespace trellis::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps (the simulated GPU works while the CPU is free for communication, as with a real one).
void Compute(double seconds, double dilation) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds * dilation));
}

}  // namespace

StatusOr<Schedule> ScheduleByName(const std::string& name) {
  if (name == "a") return Schedule::kNoOverlap;
  if (name == "b") return Schedule::kOverlap;
  if (name == "c") return Schedule::kP3;
  return InvalidArgumentError("unknown schedule '" + name + "': want a, b or c");
}

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kNoOverlap: return "a";
    case Schedule::kOverlap: return "b";
    case Schedule::kP3: return "c";
  }
  return "?";
}

StatusOr<double> SimulateTraining(Worker& worker, const Model& model,
                                  const SimulateOptions& options) {
  const size_t n = model.tensors.size();
  // One buffer per tensor: the gradient goes up from it and the sum comes back into it. Safe in
  // place: a slice's answer needs every worker's push of that slice, so it arrives after the
  // slice's bytes left.
  std::vector<std::vector<float>> buffers(n);
  std::vector<std::vector<size_t>> by_layer(model.layers());
  for (size_t k = 0; k < n; ++k) {
    const Tensor& t = model.tensors[k];
    TRELLIS_RETURN_IF_ERROR(
        worker.DeclareKey({.id = k, .name = t.name, .num_elements = t.elements}));
    buffers[k].assign(static_cast<size_t>(t.elements), 1.0f);
    by_layer[t.layer].push_back(k);
  }
  TRELLIS_RETURN_IF_ERROR(worker.FinishDeclarations());

  std::vector<Handle> handles(n);
  auto wait = [&](size_t k) -> Status { return handles[k].Wait(); };
  auto push = [&](size_t k, int priority) {
    handles[k] = worker.PushPull(k, buffers[k].data(), buffers[k].data(), priority);
  };
  const double d = options.dilation;
  const int L = model.layers();
  const int total = options.warmup_steps + options.steps;
  Clock::time_point start;
  for (int step = 0; step < total; ++step) {
    if (step == options.warmup_steps) start = Clock::now();
    // Forward.
    for (int l = 0; l < L; ++l) {
      if (options.schedule == Schedule::kP3) {
        for (size_t k : by_layer[l]) TRELLIS_RETURN_IF_ERROR(wait(k));
      }
      Compute(model.forward_s[l], d);
    }
    // Backward, last layer first.
    for (int l = L - 1; l >= 0; --l) {
      Compute(model.backward_s[l], d);
      if (options.schedule == Schedule::kNoOverlap) continue;
      for (size_t k : by_layer[l]) push(k, options.schedule == Schedule::kP3 ? -l : 0);
    }
    if (options.schedule == Schedule::kNoOverlap) {
      for (int l = L - 1; l >= 0; --l) {
        for (size_t k : by_layer[l]) push(k, 0);
      }
    }
    if (options.schedule != Schedule::kP3) {
      for (size_t k = 0; k < n; ++k) TRELLIS_RETURN_IF_ERROR(wait(k));
    }
  }
  // (c) ends a step when layer 0's forward may start; the last step's exchange is included.
  if (options.schedule == Schedule::kP3) {
    for (size_t k = 0; k < n; ++k) TRELLIS_RETURN_IF_ERROR(wait(k));
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / options.steps;
}

}  // namespace trellis::bench
