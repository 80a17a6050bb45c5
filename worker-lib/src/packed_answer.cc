#include "worker-lib/src/packed_answer.h"

namespace trellis {

StatusOr<PackedSumView> ParsePackedAnswer(const Payload& p, bool accepted, int64_t want_bytes,
                                          std::vector<uint8_t>* scratch) {
  if (!accepted) {
    return InvalidArgumentError("answered packed to a request that accepts no packed answer");
  }
  if (p.chunks == nullptr) return InvalidArgumentError("packed answer without bytes");
  const uint8_t* bytes = wire::Contiguous(*p.chunks, p.offset, p.bytes, scratch);
  return ParsePackedSum(bytes, p.bytes, static_cast<size_t>(want_bytes) / sizeof(float));
}

}  // namespace trellis
