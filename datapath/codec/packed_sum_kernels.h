// Internal to the codec: the AVX2 kernels behind packed_sum.h (packed_sum_avx2.cc), used when
// the 2-bit codec runs its AVX2 kernels (same run-time choice, TRELLIS_CODEC_FORCE_SCALAR=1 turns
// both off). They compute exactly what the scalar loops in packed_sum.cc compute.
#pragma once

#include <cstddef>
#include <cstdint>

namespace trellis::packed_internal {

// Whether the AVX2 kernels below are the ones to use in this process.
bool UseAvx2();

// The counts of sum[0..n) (round(sum_i * inv_t), clamped to +-max; inv_t = 1/t, both normal)
// into `data` (bits 4 or 8, the packed layout; n may be odd). Returns false when some element
// is more than 1/64 from an integer count, beyond +-max or not finite (`data` is then
// meaningless).
bool PackAvx2(const float* sum, size_t n, float inv_t, float max, int bits, uint8_t* data);
// out[i] = float(k_i) * t for the counts in `data` (validated before).
void UnpackAvx2(const uint8_t* data, size_t count, int bits, float t, float* out);
// Whether data[0..data_bytes) holds the one code each width never carries (-8 or -128).
bool HasInvalidCountAvx2(const uint8_t* data, size_t data_bytes, int bits);

}  // namespace trellis::packed_internal
