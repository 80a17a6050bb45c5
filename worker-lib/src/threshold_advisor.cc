#include "worker-lib/src/threshold_advisor.h"

#include <cmath>
#include <cstdio>

namespace trellis {

namespace {

std::string Number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), x >= 10.0 ? "%.0f" : "%.2g", x);
  return buf;
}

}  // namespace

std::string ThresholdAdvisor::Observe(int64_t step, const float* data, size_t n) {
  if (decided_.load(std::memory_order_relaxed)) return "";
  MutexLock lock(&mu_);
  if (decided_.load(std::memory_order_relaxed)) return "";
  if (first_step_ == 0) first_step_ = step;
  if (step == first_step_) {
    for (size_t i = 0; i < n; ++i) {
      if (std::isfinite(data[i])) {  // a NaN or Inf says nothing about the scale
        sum_abs_ += std::fabs(static_cast<double>(data[i]));
        ++count_;
      }
    }
    return "";
  }
  decided_.store(true, std::memory_order_relaxed);
  if (count_ == 0 || sum_abs_ == 0.0) return "";  // all zeros: nothing to compare with
  const double mean = sum_abs_ / static_cast<double>(count_);
  const double ratio = threshold_ / mean;
  const std::string head = "2-bit compression: threshold " + Number(threshold_) + " is " +
                           Number(ratio) + "x the mean |gradient element| (" + Number(mean) +
                           ") of this worker's first compressed step; ";
  const std::string tail = " (spec.compression.threshold; docs/compression.md, \"Choosing the "
                           "threshold and the warm-up\")";
  if (ratio > kTooLarge) {
    return head + "most elements will wait many steps and then jump by the threshold, which "
                  "costs accuracy: set it near " + Number(mean) + " or below" + tail;
  }
  if (ratio < kTooSmall) {
    return head + "every element moves by the threshold each step, a very small step: set it "
                  "near " + Number(mean) + tail;
  }
  return "";
}

}  // namespace trellis
