// The compression half of WorkerImpl (docs/compression.md): which wire op carries a step,
// encoding a slice as a 2-bit frame, and the compression figures.
#include "worker-lib/src/worker_impl.h"

namespace trellis {

bool WorkerImpl::Compressed(const KeyState& k, int64_t step) const {
  return k.codec != nullptr && step > setup_.compression.warmupSteps;
}

wire::Op WorkerImpl::WireOp(wire::Op op, bool compressed) const {
  if (!compressed) return op;
  const bool packed = setup_.compression.packedPulls;
  switch (op) {
    case wire::Op::kPush: return wire::Op::kPushTwoBit;
    case wire::Op::kPushPull:
      return packed ? wire::Op::kPushPullTwoBitPacked : wire::Op::kPushPullTwoBit;
    case wire::Op::kPull: return packed ? wire::Op::kPullPacked : wire::Op::kPull;
    default: return op;
  }
}

StatusOr<std::shared_ptr<const std::vector<uint8_t>>> WorkerImpl::EncodeSlice(KeyState& k,
                                                                              const SliceInfo& s,
                                                                              const float* src) {
  auto frame = std::make_shared<std::vector<uint8_t>>();
  TRELLIS_RETURN_IF_ERROR(k.codec->Encode(s.index, src + s.offset,
                                          static_cast<size_t>(s.num_elements), frame.get()));
  return std::shared_ptr<const std::vector<uint8_t>>(std::move(frame));
}

CompressionStats WorkerImpl::compression_stats() const {
  return {compress_in_bytes_.load(), compress_out_bytes_.load(), compress_ns_.load(),
          unpacked_bytes_.load(), packed_bytes_.load()};
}

}  // namespace trellis
