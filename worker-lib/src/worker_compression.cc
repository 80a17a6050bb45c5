// The compression half of WorkerImpl (docs/compression.md): which wire op carries a step,
// encoding a slice as a 2-bit or 16-bit frame, and the compression figures.
#include "worker-lib/src/worker_impl.h"

namespace trellis {

Status WorkerImpl::ChooseEncoding(KeyState* k) const {
  if (!k->decl.allow_compression) return Status::Ok();  // always float32
  switch (k->decl.wire) {  // the key's own 16-bit type wins over the job's setting
    case WireType::kFloat16: k->half = HalfType::kFloat16; return Status::Ok();
    case WireType::kBFloat16: k->half = HalfType::kBFloat16; return Status::Ok();
    case WireType::kJob: break;
  }
  switch (setup_.compression.type) {
    case CompressionType::kTwoBit: {
      TRELLIS_ASSIGN_OR_RETURN(
          k->codec, TwoBitCodec::Create(static_cast<float>(setup_.compression.threshold)));
      break;
    }
    case CompressionType::kFloat16: k->half = HalfType::kFloat16; break;
    case CompressionType::kBFloat16: k->half = HalfType::kBFloat16; break;
    case CompressionType::kNone: break;
  }
  return Status::Ok();
}

bool WorkerImpl::Compressed(const KeyState& k, int64_t step) const {
  return k.half.has_value() || (k.codec != nullptr && step > setup_.compression.warmupSteps);
}

wire::Op WorkerImpl::WireOp(wire::Op op, bool compressed, bool packable) const {
  if (!compressed) return op;
  const bool packed = packable && setup_.compression.packedPulls;
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
  if (k.half) {
    TRELLIS_RETURN_IF_ERROR(HalfEncode(*k.half, src + s.offset,
                                       static_cast<size_t>(s.num_elements), frame.get()));
    return std::shared_ptr<const std::vector<uint8_t>>(std::move(frame));
  }
  TRELLIS_RETURN_IF_ERROR(k.codec->Encode(s.index, src + s.offset,
                                          static_cast<size_t>(s.num_elements), frame.get()));
  return std::shared_ptr<const std::vector<uint8_t>>(std::move(frame));
}

CompressionStats WorkerImpl::compression_stats() const {
  return {compress_in_bytes_.load(), compress_out_bytes_.load(), compress_ns_.load(),
          unpacked_bytes_.load(), packed_bytes_.load()};
}

}  // namespace trellis
