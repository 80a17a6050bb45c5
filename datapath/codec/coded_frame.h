// The payload of a compressed push (wire::IsTwoBit ops): a 2-bit frame (twobit.h) or a 16-bit
// frame (half.h), told apart by their magic. What the parameter server validates outside a
// slice's lock and then decodes, or adds into the step's float32 sum, under it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/base/status.h"
#include "datapath/codec/half.h"
#include "datapath/codec/twobit.h"

namespace trellis {

struct CodedFrame {
  bool is_half = false;  // which of the two below is set
  TwoBitFrame twobit;
  HalfFrame half;
};

// Validates the frame completely; its count must be expected_count. Errors are the 2-bit or
// 16-bit parser's ("2bit frame: ...", "16-bit frame: ...").
StatusOr<CodedFrame> ParseCodedFrame(const uint8_t* payload, size_t bytes, size_t expected_count);
// out[0..count) = the frame's values, or acc[0..count) += them.
void DecodeCodedFrame(const CodedFrame& f, float* out);
void DecodeAddCodedFrame(const CodedFrame& f, float* acc);
// The threshold a step's sum of such pushes may be packed with (packed_sum.h): a 2-bit frame's
// threshold; 0 (never packed) for a 16-bit frame, whose sum is no multiple of a threshold.
inline float PackThreshold(const CodedFrame& f) { return f.is_half ? 0.0f : f.twobit.threshold; }

}  // namespace trellis
