// What a moved slice's state looks like on the wire at a server resize (wire::Op::kHandOut and
// kHandIn; pserver/slice_handover.h does the moving). A slice's state comes in up to three parts,
// each at most one slice of floats plus a small header, so a part fits the frame bound both ends
// already keep (MaxMessageBytes): a whole update-mode Adam slice (values, m, v) would not.
//
//   part kState        the 32-byte state block below, then the kept result of `complete` (the
//                      step's sum in aggregate mode, the weights in update mode): the slice's
//                      elements as float32; nothing for a slice with no result yet (step 0
//                      before its broadcast: HandoverCarriesValues)
//   part kOptimizerM   update mode, when the optimizer keeps a first moment: float32 x elements
//   part kOptimizerV   likewise the second moment
//
// The state block, little-endian: magic "TRH1" (u32), flags (u32: bit 0 initialized, bit 1 has
// m, bit 2 has v; no other bit), complete (i64), step_base (i64), 8 reserved zero bytes.
//
// kHandOut's payload is the part asked for (u32); its answer is that part. kHandIn's payload is
// the part (u32) and then the part as kHandOut answered it. A server answers a part as float32
// words (the state block is eight of them), so it goes through the answer path of any pull.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "datapath/frame.h"

namespace trellis::wire {

enum class HandoverPart : uint32_t { kState = 0, kOptimizerM = 1, kOptimizerV = 2 };
inline constexpr uint32_t kHandoverParts = 3;
inline constexpr size_t kHandoverPartBytes = 4;
inline constexpr size_t kHandoverStateBytes = 32;
inline constexpr size_t kHandoverStateWords = kHandoverStateBytes / sizeof(float);
// "state", "optimizer m", "optimizer v"
const char* HandoverPartName(HandoverPart part);

struct HandoverState {
  int64_t complete = 0;     // the slice's latest complete step: what its part kState holds
  int64_t step_base = 0;    // update mode: optimizer steps before a restore (slice.h)
  bool initialized = false; // step 0's value had arrived (aggregate mode may count steps without)
  bool has_m = false;       // update mode: part kOptimizerM exists
  bool has_v = false;       // update mode: part kOptimizerV exists
};

// The parts a slice of this state has (a bit per HandoverPart).
uint32_t HandoverPartsOf(const HandoverState& s);
// Whether part kState carries the slice's values after the block: a kept result exists.
inline bool HandoverCarriesValues(const HandoverState& s) { return s.initialized || s.complete > 0; }

std::vector<uint8_t> EncodeHandoverPart(HandoverPart part);
// The part named at byte `offset` of `frame` (`bytes` of payload from there on, at least 4):
// INVALID_ARGUMENT for fewer bytes or an unknown part.
StatusOr<HandoverPart> ParseHandoverPart(const Chunks& frame, size_t offset, uint64_t bytes);

void EncodeHandoverState(const HandoverState& s, uint8_t out[kHandoverStateBytes]);
// INVALID_ARGUMENT naming what is wrong: the magic, an unknown flag, a negative step, a
// non-zero reserved field, optimizer state of a slice never initialized.
Status ParseHandoverState(const uint8_t in[kHandoverStateBytes], HandoverState* out);

}  // namespace trellis::wire
