// Packed pull answers: the lossless short form of a sum of 2-bit pushes (docs/compression.md,
// "Packed pull answers").
//
// When every one of the W pushes of a slice's step was a 2-bit frame with the same threshold t,
// each element of the server's sum is k*t with an integer |k| <= W. The server sends k in 4 bits
// (W <= 7) or 8 bits (W <= 127) instead of the float32 sum; the worker decodes float(k) * t
// (one correctly rounded float32 product). That value is the exact sum rounded once: it equals
// the server's float32 sum bit for bit when t is a power of two or W <= 3; otherwise the float32
// sum itself depends on the order the pushes arrived in and may differ from k*t in the last
// bit. All workers decode the same bytes, so they stay bit-identical to each other.
//
// Wire payload ("packed answer"), all fields little-endian:
//   offset 0  u32  magic     0x4B505254 (bytes "TRPK")
//   offset 4  u16  version   1
//   offset 6  u8   bits      4 or 8
//   offset 7  u8   reserved  0
//   offset 8  f32  threshold finite, > 0
//   offset 12 u32  count     number of elements
//   offset 16 the counts k, two's complement: bits 8: one int8 per element; bits 4: element 2j in
//             the low nibble of byte j, element 2j+1 in the high nibble, an odd count pads the
//             last high nibble with 0. The most negative value (-8, -128) is never produced and
//             is rejected, so the range is symmetric: |k| <= 7 or <= 127.
// A packed answer is exactly 16 + ceil(count * bits / 8) bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/base/status.h"

namespace trellis {

inline constexpr uint32_t kPackedSumMagic = 0x4B505254;  // "TRPK" as little-endian bytes
inline constexpr uint16_t kPackedSumVersion = 1;
inline constexpr size_t kPackedSumHeaderBytes = 16;

// Bits per element for a sum of `summands` 2-bit pushes: 4 when <= 7, 8 when <= 127, else 0
// (not packable: the answer stays float32).
int PackedSumBits(int64_t summands);
// Largest |k| that `bits` (4 or 8) carry: 7 or 127.
constexpr int32_t PackedSumMaxCount(int bits) { return bits == 4 ? 7 : 127; }
// Size of a whole packed answer of n elements. REQUIRES: bits is 4 or 8.
constexpr size_t PackedSumBytes(size_t n, int bits) {
  return kPackedSumHeaderBytes + (bits == 4 ? (n + 1) / 2 : n);
}

// Writes the packed answer of sum[0..n) into out[0..PackedSumBytes(n, bits)): k_i is sum[i] / t
// rounded to the nearest integer. Fails, and the caller answers float32 instead, when the sum
// is not such a sum: some sum[i] / t is more than 1/64 away from an integer or beyond the range
// of `bits` (or not finite), t is not a valid threshold, bits is not 4 or 8, n does not fit the
// count field or out_bytes is not the packed size. Errors are INVALID_ARGUMENT "packed answer: ...".
Status PackSum(const float* sum, size_t n, float threshold, int bits, uint8_t* out,
               size_t out_bytes);

// A validated packed answer: points into the caller's buffer.
struct PackedSumView {
  size_t count = 0;
  int bits = 0;
  float threshold = 0;
  const uint8_t* data = nullptr;  // the counts, after the header
};
// Validates a packed answer completely: header, count == expected_count, exact length, every
// count in range, padding. A packed answer comes from the network: errors are INVALID_ARGUMENT
// "packed answer: ..." naming the first problem.
StatusOr<PackedSumView> ParsePackedSum(const uint8_t* bytes, size_t size, size_t expected_count);
// Writes out[i] = float(k_i) * t for an answer ParsePackedSum accepted (for a worker that
// validates before taking the lock its output buffer is written under).
void UnpackParsedSum(const PackedSumView& view, float* out);
// ParsePackedSum, then UnpackParsedSum: on error `out` is untouched.
Status UnpackSum(const uint8_t* bytes, size_t size, size_t expected_count, float* out);

// The same decoding, one element at a time with no table: the reference UnpackSum is tested
// against. REQUIRES: bytes passed UnpackSum's checks.
void UnpackSumReference(const uint8_t* bytes, float* out);

}  // namespace trellis
