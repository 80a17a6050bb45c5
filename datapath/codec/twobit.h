// 2-bit gradient compression with error feedback (residual), after MXNet's "2bit" gradient
// compression (apache/mxnet PR #8662). Used per slice: the worker quantizes each slice against
// that slice's residual before pushing; the server dequantizes (and sums) every push.
//
// Quantization, per element i (float32 arithmetic, in this order on every path):
//   r = residual[i] + grad[i]
//   r >= +t  -> code 11, decoded +t
//   r <= -t  -> code 10, decoded -t
//   else     -> code 00, decoded 0.0f
//   rest = r - decoded
//   rest = rest < -t ? -t : rest     (NaN compares false: a NaN stays NaN)
//   rest = rest >  t ?  t : rest
//   residual[i] = rest
// The residual is bounded to [-t, t]: what exceeds it is dropped, not queued (unbounded error
// feedback lags behind a gradient that changed sign, and with momentum that diverges).
// Code 01 is never produced; a decoder rejects it. 16 codes per 32-bit word, element 16w+0 in
// bits 31..30 of word w, element 16w+15 in bits 1..0; the last word is padded with 00.
//
// NaN and Inf: comparisons with NaN are false, so an element whose r is NaN encodes 00 and the
// NaN stays in the residual (visible to the owner, never sent). r = +Inf encodes 11 and leaves
// the residual at t (Inf - t == Inf, bounded to t), as any r >= 2t does; -Inf likewise with 10
// and -t. See docs/compression.md.
//
// Wire payload ("frame"), all fields little-endian:
//   offset 0  u32  magic     0x42325254 (bytes "TR2B")
//   offset 4  u16  version   1
//   offset 6  u16  reserved  0
//   offset 8  f32  threshold finite, > 0
//   offset 12 u32  count     number of elements
//   offset 16 u32  words[ceil(count / 16)]
// A frame is exactly 16 + 4 * ceil(count / 16) bytes. The decoders validate every field, the
// exact length, the codes (no 01) and the padding (00) before writing any output, so a bad
// frame leaves the output untouched and never reads past `bytes`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/base/status.h"

namespace trellis {

inline constexpr size_t kTwoBitElementsPerWord = 16;
inline constexpr size_t kTwoBitHeaderBytes = 16;
inline constexpr uint32_t kTwoBitMagic = 0x42325254;  // "TR2B" as little-endian bytes
inline constexpr uint16_t kTwoBitVersion = 1;
// The count field is 32 bits: a frame carries at most this many elements (a slice, not a model).
inline constexpr size_t kTwoBitMaxElements = UINT32_MAX;

// Number of 32-bit code words for n elements: ceil(n / 16).
constexpr size_t TwoBitWords(size_t n) { return (n + kTwoBitElementsPerWord - 1) / kTwoBitElementsPerWord; }
// Size of a whole frame (header + words) for n elements.
constexpr size_t TwoBitEncodedBytes(size_t n) { return kTwoBitHeaderBytes + 4 * TwoBitWords(n); }

// OK when t is finite and > 0; else INVALID_ARGUMENT naming the value.
Status ValidateTwoBitThreshold(float threshold);

// --- Raw kernels (no header). Dispatch to AVX2 when the CPU has it, unless the environment
// variable TRELLIS_CODEC_FORCE_SCALAR=1 (read once, at first use). Both paths give identical
// words and identical residuals.

// Quantizes n elements: residual updated in place, TwoBitWords(n) words written (host order).
// REQUIRES: threshold valid (ValidateTwoBitThreshold); grad, residual, words do not overlap.
void TwoBitQuantize(const float* grad, float* residual, size_t n, float threshold, uint32_t* words);

// Checks TwoBitWords(n) words: no 01 code, padding codes after element n are 00.
// The error names the first bad element.
Status TwoBitValidateWords(const uint32_t* words, size_t n);

// Decodes words into out[0..n) (out = code value) or adds into acc[0..n) (acc += code value;
// 00 adds +0.0f). REQUIRES: words validated (a 01 code decodes as 0 here).
void TwoBitDequantizeWords(const uint32_t* words, size_t n, float threshold, float* out);
void TwoBitDequantizeAddWords(const uint32_t* words, size_t n, float threshold, float* acc);

// --- Frames (what travels on the wire). Buffers need no particular alignment.

// Quantizes and writes a whole frame into payload[0..TwoBitEncodedBytes(n)).
// Errors: bad threshold, n > kTwoBitMaxElements, payload_bytes too small (nothing is written and
// the residual is untouched on error).
Status TwoBitEncode(const float* grad, float* residual, size_t n, float threshold, uint8_t* payload,
                    size_t payload_bytes);

// A validated frame: points into the caller's buffer.
struct TwoBitFrame {
  size_t count = 0;
  float threshold = 0;
  const uint8_t* words = nullptr;  // TwoBitWords(count) little-endian words, maybe unaligned
};

// Validates a frame completely (header, length, codes, padding). When expected_count is given
// the count must equal it (a slice has a fixed size). Errors are INVALID_ARGUMENT with a message
// saying what is wrong ("2bit frame: ...").
StatusOr<TwoBitFrame> TwoBitParse(const uint8_t* payload, size_t bytes);
StatusOr<TwoBitFrame> TwoBitParse(const uint8_t* payload, size_t bytes, size_t expected_count);

// Decode / add a frame TwoBitParse accepted (no second validation pass): out[0..count) = values,
// or acc[0..count) += values. For a server that validates outside its lock and sums under it.
void TwoBitDequantizeFrame(const TwoBitFrame& frame, float* out);
void TwoBitDequantizeAddFrame(const TwoBitFrame& frame, float* acc);

// Validate + decode a frame of exactly n elements into out[0..n).
Status TwoBitDequantize(const uint8_t* payload, size_t bytes, float* out, size_t n);
// Validate + add a frame of exactly n elements into acc[0..n) (the server summing pushes).
Status TwoBitDequantizeAdd(const uint8_t* payload, size_t bytes, float* acc, size_t n);

// Which CPU path the dispatching functions use: "avx2" or "scalar".
std::string_view TwoBitActivePath();

}  // namespace trellis
