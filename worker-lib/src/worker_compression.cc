#include "worker-lib/src/worker_compression.h"

#include <chrono>
#include <string>

#include "common/base/logging.h"

namespace trellis {

WorkerCompression::WorkerCompression(const CompressionSpec& spec, int32_t rank,
                                     MetricsRegistry& m)
    : spec_(spec),
      rank_(rank),
      bytes_in_(m.Counter("trellis_worker_compression_input_bytes_total",
                          "Gradient bytes of compressed pushes, before compression (float32).")),
      bytes_out_(m.Counter("trellis_worker_compression_output_bytes_total",
                           "What the compressed pushes were sent as (2-bit frames), in bytes.")),
      seconds_(m.Histogram("trellis_worker_compression_seconds",
                           "Time to compress one push (every slice of the key).",
                           MetricsRegistry::LatencyBuckets())),
      pulled_unpacked_(m.Counter("trellis_worker_compression_pulled_unpacked_bytes_total",
                                 "Packed pull answers: the float32 bytes they decoded to.")),
      pulled_packed_(m.Counter("trellis_worker_compression_pulled_packed_bytes_total",
                               "Packed pull answers: the bytes they took on the wire.")) {}

Status WorkerCompression::ChooseEncoding(KeyState* k) const {
  if (!k->decl.allow_compression) return Status::Ok();  // always float32
  switch (k->decl.wire) {  // the key's own 16-bit type wins over the job's setting
    case WireType::kFloat16: k->half = HalfType::kFloat16; return Status::Ok();
    case WireType::kBFloat16: k->half = HalfType::kBFloat16; return Status::Ok();
    case WireType::kJob: break;
  }
  switch (spec_.type) {
    case CompressionType::kTwoBit: {
      TRELLIS_ASSIGN_OR_RETURN(k->codec,
                               TwoBitCodec::Create(static_cast<float>(spec_.threshold)));
      break;
    }
    case CompressionType::kFloat16: k->half = HalfType::kFloat16; break;
    case CompressionType::kBFloat16: k->half = HalfType::kBFloat16; break;
    case CompressionType::kNone: break;
  }
  return Status::Ok();
}

bool WorkerCompression::Compressed(const KeyState& k, int64_t step) const {
  return k.half.has_value() || (k.codec != nullptr && step > spec_.warmupSteps);
}

wire::Op WorkerCompression::WireOp(wire::Op op, bool compressed, bool packable) const {
  if (!compressed) return op;
  const bool packed = packable && spec_.packedPulls;
  switch (op) {
    case wire::Op::kPush: return wire::Op::kPushTwoBit;
    case wire::Op::kPushPull:
      return packed ? wire::Op::kPushPullTwoBitPacked : wire::Op::kPushPullTwoBit;
    case wire::Op::kPull: return packed ? wire::Op::kPullPacked : wire::Op::kPull;
    default: return op;
  }
}

StatusOr<std::vector<WorkerCompression::Frame>> WorkerCompression::EncodePush(KeyState& k,
                                                                             int64_t step,
                                                                             const float* src) {
  if (k.codec != nullptr) {
    const std::string advice =
        threshold_advisor_.Observe(step, src, static_cast<size_t>(k.decl.num_elements));
    if (!advice.empty()) TLOG_WARN << "worker " << rank_ << ": " << advice;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Frame> frames(k.slices.size());
  for (size_t i = 0; i < k.slices.size(); ++i) {
    TRELLIS_ASSIGN_OR_RETURN(frames[i], EncodeSlice(k, k.slices[i], src));
    const uint64_t in = static_cast<uint64_t>(k.slices[i].num_elements) * sizeof(float);
    in_bytes_.fetch_add(in);
    out_bytes_.fetch_add(frames[i]->size());
    bytes_in_.Increment(static_cast<double>(in));
    bytes_out_.Increment(static_cast<double>(frames[i]->size()));
  }
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t0).count();
  ns_.fetch_add(static_cast<uint64_t>(ns));
  seconds_.Observe(static_cast<double>(ns) * 1e-9);
  return frames;
}

StatusOr<WorkerCompression::Frame> WorkerCompression::EncodeSlice(KeyState& k,
                                                                  const SliceInfo& s,
                                                                  const float* src) {
  auto frame = std::make_shared<std::vector<uint8_t>>();
  if (k.half) {
    TRELLIS_RETURN_IF_ERROR(HalfEncode(*k.half, src + s.offset,
                                       static_cast<size_t>(s.num_elements), frame.get()));
    return Frame(std::move(frame));
  }
  TRELLIS_RETURN_IF_ERROR(k.codec->Encode(s.index, src + s.offset,
                                          static_cast<size_t>(s.num_elements), frame.get()));
  return Frame(std::move(frame));
}

void WorkerCompression::CountPackedAnswer(uint64_t unpacked_bytes, uint64_t packed_bytes) {
  unpacked_bytes_.fetch_add(unpacked_bytes);
  packed_bytes_.fetch_add(packed_bytes);
  pulled_unpacked_.Increment(static_cast<double>(unpacked_bytes));
  pulled_packed_.Increment(static_cast<double>(packed_bytes));
}

CompressionStats WorkerCompression::stats() const {
  return {in_bytes_.load(), out_bytes_.load(), ns_.load(), unpacked_bytes_.load(),
          packed_bytes_.load()};
}

}  // namespace trellis
