// 16-bit gradients on the wire (docs/compression.md, "16-bit gradients"): a worker sends a
// slice's float32 gradient as float16 or bfloat16 values (round to nearest even); the server
// converts each push back to float32 and sums in float32, so the sum of W pushes carries no
// 16-bit rounding beyond each push's own. No residual: a 16-bit value is within half a unit
// in the last place of the gradient (float16 overflows to +-Inf above 65504, bfloat16 has
// float32's range), unlike 2-bit, whose error must be fed back.
//
// Wire payload ("16-bit frame"), carried by the same ops as a 2-bit frame (wire::IsTwoBit: the
// frames tell themselves apart by their magic), all fields little-endian:
//   offset 0  u32  magic     0x36315254 (bytes "TR16")
//   offset 4  u16  version   1
//   offset 6  u8   type      1 float16 (IEEE binary16), 2 bfloat16
//   offset 7  u8   reserved  0
//   offset 8  u32  count     number of elements
//   offset 12 u32  reserved  0
//   offset 16 u16  values[count]
// A frame is exactly 16 + 2 * count bytes. HalfParse checks every header field and the exact
// length before anything is decoded; every 16-bit pattern is a valid value (NaN included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/base/status.h"

namespace trellis {

enum class HalfType : uint8_t { kFloat16 = 1, kBFloat16 = 2 };

inline constexpr size_t kHalfHeaderBytes = 16;
inline constexpr uint32_t kHalfMagic = 0x36315254;  // "TR16" as little-endian bytes
inline constexpr uint16_t kHalfVersion = 1;

constexpr size_t HalfEncodedBytes(size_t n) { return kHalfHeaderBytes + 2 * n; }
const char* HalfTypeName(HalfType t);  // "float16", "bfloat16"

// One value, round to nearest even (NaN stays NaN, quiet; float16: overflow gives +-Inf,
// underflow subnormals then +-0).
uint16_t FloatToHalf(HalfType t, float v);
float HalfToFloat(HalfType t, uint16_t h);

// Writes the frame of grad[0..n) into *out (resized to HalfEncodedBytes(n)).
// Errors: n = 0 or more than UINT32_MAX elements.
Status HalfEncode(HalfType t, const float* grad, size_t n, std::vector<uint8_t>* out);

// A validated frame: points into the caller's buffer.
struct HalfFrame {
  HalfType type = HalfType::kFloat16;
  size_t count = 0;
  const uint8_t* values = nullptr;  // count little-endian u16, maybe unaligned
};

// Validates header and length; the count must equal expected_count (a slice has a fixed size).
// Errors are INVALID_ARGUMENT "16-bit frame: ...".
StatusOr<HalfFrame> HalfParse(const uint8_t* payload, size_t bytes, size_t expected_count);
// out[0..count) = values, or acc[0..count) += values (float32 arithmetic).
void HalfDecodeFrame(const HalfFrame& f, float* out);
void HalfDecodeAddFrame(const HalfFrame& f, float* acc);

}  // namespace trellis
