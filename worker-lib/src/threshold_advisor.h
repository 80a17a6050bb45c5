// Tells the user, once, when the job's 2-bit threshold is far from the size of the gradients it
// compresses. The threshold is a step size (docs/compression.md, "Choosing the threshold"): one
// far above a typical gradient element makes every element wait many steps and then jump, which
// silently costs accuracy (the shipped PyTorch example fell from 99% to 52% at 0.5, 196 times its
// gradients). The workers see the gradients, so they can say what to set instead.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/mutex.h"

namespace trellis {

class ThresholdAdvisor {
 public:
  // Advice when threshold / mean |gradient| is above kTooLarge or below kTooSmall.
  static constexpr double kTooLarge = 10.0;
  static constexpr double kTooSmall = 0.01;

  explicit ThresholdAdvisor(double threshold) : threshold_(threshold) {}

  // One compressed push of `step` (its float32 data). The pushes of the first compressed step
  // are measured (one read of them, once); the first push of a later step decides. Returns the
  // advice the first time it is decided and needed, else "". Cheap once decided.
  std::string Observe(int64_t step, const float* data, size_t n) EXCLUDES(mu_);

 private:
  const double threshold_;
  std::atomic<bool> decided_{false};
  Mutex mu_;
  int64_t first_step_ GUARDED_BY(mu_) = 0;  // the step measured (0: none yet)
  double sum_abs_ GUARDED_BY(mu_) = 0.0;
  uint64_t count_ GUARDED_BY(mu_) = 0;  // finite elements measured
};

}  // namespace trellis
