// Per-slice 2-bit compression state for a worker: one residual per slice, created on the
// slice's first Encode. What the worker library holds when a job runs with `compression: 2bit`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"

namespace trellis {

class TwoBitCodec {
 public:
  // Errors when the threshold is not finite and > 0.
  static StatusOr<std::unique_ptr<TwoBitCodec>> Create(float threshold);

  // Quantizes grad[0..n) against slice `slice`'s residual and writes the frame into *out
  // (resized to TwoBitEncodedBytes(n)). A slice keeps its size: a different n is an error.
  // Thread-safe; calls for the same slice are serialized.
  Status Encode(uint64_t slice, const float* grad, size_t n, std::vector<uint8_t>* out);
  // Same, into a caller buffer of payload_bytes >= TwoBitEncodedBytes(n).
  Status Encode(uint64_t slice, const float* grad, size_t n, uint8_t* payload, size_t payload_bytes);

  // A copy of the slice's residual (empty when the slice was never encoded).
  std::vector<float> Residual(uint64_t slice) const;
  // Zeroes every residual, e.g. after a restore from a checkpoint or a NaN gradient.
  void Reset();

  float threshold() const { return threshold_; }

 private:
  struct Slice {
    std::mutex mu;
    std::vector<float> residual;  // GUARDED_BY(mu)
  };

  explicit TwoBitCodec(float threshold) : threshold_(threshold) {}
  // The slice's state, created with n zeros on first use; error when sizes disagree.
  StatusOr<Slice*> GetSlice(uint64_t slice, size_t n);

  const float threshold_;
  mutable std::mutex mu_;
  // Slices are never erased, so a Slice* stays valid after mu_ is released.
  std::unordered_map<uint64_t, std::unique_ptr<Slice>> slices_;  // GUARDED_BY(mu_)
};

}  // namespace trellis
