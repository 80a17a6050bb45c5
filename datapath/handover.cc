#include "datapath/handover.h"

#include <string>

#include "datapath/le_bytes.h"

namespace trellis::wire {
namespace {

constexpr uint32_t kHandoverMagic = 0x31485254;  // "TRH1" little-endian
constexpr uint32_t kInitialized = 1, kHasM = 2, kHasV = 4;

}  // namespace

const char* HandoverPartName(HandoverPart part) {
  switch (part) {
    case HandoverPart::kState: return "state";
    case HandoverPart::kOptimizerM: return "optimizer m";
    case HandoverPart::kOptimizerV: return "optimizer v";
  }
  return "part(?)";
}

uint32_t HandoverPartsOf(const HandoverState& s) {
  return 1u | (s.has_m ? 1u << 1 : 0) | (s.has_v ? 1u << 2 : 0);
}

std::vector<uint8_t> EncodeHandoverPart(HandoverPart part) {
  std::vector<uint8_t> out(kHandoverPartBytes);
  PutLe<uint32_t>(out.data(), 0, static_cast<uint32_t>(part));
  return out;
}

StatusOr<HandoverPart> ParseHandoverPart(const Chunks& frame, size_t offset, uint64_t bytes) {
  if (bytes < kHandoverPartBytes) {
    return InvalidArgumentError("handover: " + std::to_string(bytes) +
                                " payload bytes, shorter than the 4-byte part");
  }
  uint8_t b[kHandoverPartBytes];
  CopyOut(frame, offset, kHandoverPartBytes, b);
  const uint32_t part = GetLe<uint32_t>(b, 0);
  if (part >= kHandoverParts) {
    return InvalidArgumentError("handover: unknown part " + std::to_string(part));
  }
  return static_cast<HandoverPart>(part);
}

void EncodeHandoverState(const HandoverState& s, uint8_t out[kHandoverStateBytes]) {
  const uint32_t flags =
      (s.initialized ? kInitialized : 0) | (s.has_m ? kHasM : 0) | (s.has_v ? kHasV : 0);
  PutLe<uint32_t>(out, 0, kHandoverMagic);
  PutLe<uint32_t>(out, 4, flags);
  PutLe<int64_t>(out, 8, s.complete);
  PutLe<int64_t>(out, 16, s.step_base);
  PutLe<uint64_t>(out, 24, 0);
}

Status ParseHandoverState(const uint8_t in[kHandoverStateBytes], HandoverState* out) {
  if (GetLe<uint32_t>(in, 0) != kHandoverMagic) {
    return InvalidArgumentError("handover: the state block does not start with TRH1");
  }
  const uint32_t flags = GetLe<uint32_t>(in, 4);
  if ((flags & ~(kInitialized | kHasM | kHasV)) != 0) {
    return InvalidArgumentError("handover: unknown state flags " + std::to_string(flags));
  }
  HandoverState s;
  s.initialized = (flags & kInitialized) != 0;
  s.has_m = (flags & kHasM) != 0;
  s.has_v = (flags & kHasV) != 0;
  s.complete = GetLe<int64_t>(in, 8);
  s.step_base = GetLe<int64_t>(in, 16);
  if (s.complete < 0 || s.step_base < 0) {
    return InvalidArgumentError("handover: negative step (complete " + std::to_string(s.complete) +
                                ", step base " + std::to_string(s.step_base) + ")");
  }
  if (GetLe<uint64_t>(in, 24) != 0) {
    return InvalidArgumentError("handover: the state block's reserved bytes are not zero");
  }
  if (!s.initialized && (s.has_m || s.has_v)) {
    return InvalidArgumentError("handover: a slice never initialized has no optimizer state");
  }
  *out = s;
  return Status::Ok();
}

}  // namespace trellis::wire
