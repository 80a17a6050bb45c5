// How a worker's pushes travel compressed (the job's spec.compression; docs/compression.md):
// which keys are encoded and how (2-bit frames with per-slice residuals, or 16-bit frames), which
// wire op carries a step, encoding a push's slices, and the compression figures (CompressionStats
// and the trellis_worker_compression_* series).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/base/status.h"
#include "common/job/job_spec.h"
#include "common/metrics/metrics.h"
#include "datapath/frame.h"
#include "trellis/trellis.h"
#include "worker-lib/src/key_state.h"
#include "worker-lib/src/threshold_advisor.h"

namespace trellis {

class WorkerCompression {
 public:
  // One slice's encoded push, shared with the transport (SliceRequest::encoded).
  using Frame = std::shared_ptr<const std::vector<uint8_t>>;

  // `rank` names the worker in the threshold advice. Registers the series in `metrics`.
  WorkerCompression(const CompressionSpec& spec, int32_t rank, MetricsRegistry& metrics);
  WorkerCompression(const WorkerCompression&) = delete;
  WorkerCompression& operator=(const WorkerCompression&) = delete;

  // Sets k's codec or 16-bit type from its declaration and the job's spec.compression.
  Status ChooseEncoding(KeyState* k) const;
  // Whether the push of `step` of `k` goes compressed: 16-bit, or 2-bit (2bit job, key allows,
  // warm-up over).
  bool Compressed(const KeyState& k, int64_t step) const;
  // The op that carries `op` (push, pull, pushpull) of a step: its 2-bit form when `compressed`
  // (a 16-bit frame travels in the same ops), and the form that accepts a packed answer when the
  // job has packedPulls and the key is 2-bit (`packable`).
  wire::Op WireOp(wire::Op op, bool compressed, bool packable) const;
  // Every slice of a compressed push of `step`, in slice order: 2-bit frames (updating the
  // slices' residuals; the 2-bit threshold is checked against the gradients once) or 16-bit
  // frames. Not thread-safe per key: the caller encodes a key's pushes in step order.
  StatusOr<std::vector<Frame>> EncodePush(KeyState& k, int64_t step, const float* src);
  // A packed pull answer arrived: its float32 size and its wire size.
  void CountPackedAnswer(uint64_t unpacked_bytes, uint64_t packed_bytes);
  CompressionStats stats() const;

 private:
  StatusOr<Frame> EncodeSlice(KeyState& k, const SliceInfo& s, const float* src);

  const CompressionSpec spec_;
  const int32_t rank_;
  std::atomic<uint64_t> in_bytes_{0};
  std::atomic<uint64_t> out_bytes_{0};
  std::atomic<uint64_t> ns_{0};
  std::atomic<uint64_t> unpacked_bytes_{0};  // packed answers: their float32 size
  std::atomic<uint64_t> packed_bytes_{0};    // packed answers: their wire size
  // The same in the registry (docs/compression.md, Metrics).
  prometheus::Counter& bytes_in_;
  prometheus::Counter& bytes_out_;
  prometheus::Histogram& seconds_;  // per compressed operation (all its slices)
  prometheus::Counter& pulled_unpacked_;
  prometheus::Counter& pulled_packed_;
  // Says once when the 2-bit threshold is far from the gradients (the log, a warning).
  ThresholdAdvisor threshold_advisor_{spec_.threshold};
};

}  // namespace trellis
