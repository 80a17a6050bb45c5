// AVX2 kernels for packed answers (packed_sum_kernels.h). Compiled for AVX2 by target attribute
// only, so the library runs on any x86-64; the same float operations as the scalar loops in
// packed_sum.cc (a product by 1/t, the 1.5 * 2^23 rounding, one product per decoded element),
// so the bytes and floats are identical. 16 elements per iteration; the rest goes to the scalar
// loop of the same file (packed_sum.cc calls these for a prefix and finishes the tail).
#include "datapath/codec/packed_sum_kernels.h"

#include <cstring>

#include "datapath/codec/twobit_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TRELLIS_PACKED_X86 1
#endif

namespace trellis::packed_internal {

bool UseAvx2() {
  static const bool use = &twobit_internal::ActiveKernels() != &twobit_internal::ScalarKernels();
  return use;
}

#ifdef TRELLIS_PACKED_X86
#define TRELLIS_AVX2 __attribute__((target("avx2")))

TRELLIS_AVX2 bool PackAvx2(const float* sum, size_t n, float inv_t, float max, int bits,
                           uint8_t* data) {
  const __m256 vinv = _mm256_set1_ps(inv_t);
  const __m256 vround = _mm256_set1_ps(12582912.0f);
  const __m256 vtol = _mm256_set1_ps(1.0f / 64);
  const __m256 vmax = _mm256_set1_ps(max);
  const __m256 vnmax = _mm256_set1_ps(-max);
  const __m256 vabs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  const __m128i lo_nibble = _mm_set1_epi16(0x000F);
  const __m128i hi_nibble = _mm_set1_epi16(0x00F0);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i k32[2];
    for (int h = 0; h < 2; ++h) {
      const __m256 q = _mm256_mul_ps(_mm256_loadu_ps(sum + i + 8 * h), vinv);
      const __m256 k = _mm256_sub_ps(_mm256_add_ps(q, vround), vround);
      const __m256 near = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(q, k), vabs), vtol, _CMP_LE_OQ);
      const __m256 in = _mm256_cmp_ps(_mm256_and_ps(k, vabs), vmax, _CMP_LE_OQ);
      ok = _mm256_and_ps(ok, _mm256_and_ps(near, in));
      k32[h] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(k, vnmax), vmax));
    }
    // int32 -> int16 (per 128-bit lane), put the 64-bit quarters back in order, -> int8.
    const __m256i k16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(k32[0], k32[1]), 0xD8);
    const __m128i k8 = _mm_packs_epi16(_mm256_castsi256_si128(k16), _mm256_extracti128_si256(k16, 1));
    if (bits == 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(data + i), k8);
    } else {
      // Each 16-bit lane holds elements 2j (low byte) and 2j+1 (high byte): their low nibbles
      // into one byte, then the lanes narrowed to bytes.
      const __m128i pair = _mm_or_si128(_mm_and_si128(k8, lo_nibble),
                                        _mm_and_si128(_mm_srli_epi16(k8, 4), hi_nibble));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(data + i / 2), _mm_packus_epi16(pair, pair));
    }
  }
  bool good = _mm256_movemask_ps(ok) == 0xFF;
  // The tail: the scalar operations, one element at a time.
  for (; i < n; ++i) {
    const float q = sum[i] * inv_t;
    const float k = (q + 12582912.0f) - 12582912.0f;
    const float d = q - k;
    good &= (d <= 1.0f / 64 && d >= -1.0f / 64) & (k <= max && k >= -max);
    float c = k > max ? max : k;
    c = c < -max ? -max : c;
    const int32_t v = static_cast<int32_t>(c == c ? c : 0.0f);
    if (bits == 8) {
      data[i] = static_cast<uint8_t>(v);
    } else if (i % 2 == 0) {
      data[i / 2] = static_cast<uint8_t>(v & 15);
    } else {
      data[i / 2] = static_cast<uint8_t>(data[i / 2] | ((v & 15) << 4));
    }
  }
  return good;
}

TRELLIS_AVX2 void UnpackAvx2(const uint8_t* data, size_t count, int bits, float t, float* out) {
  const __m256 vt = _mm256_set1_ps(t);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i eight = _mm_set1_epi8(8);
  size_t i = 0;
  for (; i + 16 <= count; i += 16) {
    __m128i k8;  // 16 counts as int8
    if (bits == 8) {
      k8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + i));
    } else {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(data + i / 2));
      const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(b, low4),
                                            _mm_and_si128(_mm_srli_epi16(b, 4), low4));
      k8 = _mm_sub_epi8(_mm_xor_si128(nib, eight), eight);  // sign-extend the nibbles
    }
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(k8));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(k8, 8)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(lo, vt));
    _mm256_storeu_ps(out + i + 8, _mm256_mul_ps(hi, vt));
  }
  for (; i < count; ++i) {
    int32_t k;
    if (bits == 8) {
      k = static_cast<int8_t>(data[i]);
    } else {
      const uint8_t v = static_cast<uint8_t>((i % 2 == 0 ? data[i / 2] : data[i / 2] >> 4) & 15);
      k = static_cast<int32_t>(v) - ((v & 8) << 1);
    }
    out[i] = static_cast<float>(k) * t;
  }
}

TRELLIS_AVX2 bool HasInvalidCountAvx2(const uint8_t* data, size_t data_bytes, int bits) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bad = _mm256_set1_epi8(bits == 8 ? static_cast<char>(0x80) : 8);
  __m256i any = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= data_bytes; i += 32) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i));
    if (bits == 8) {
      any = _mm256_or_si256(any, _mm256_cmpeq_epi8(b, bad));
    } else {
      any = _mm256_or_si256(any, _mm256_cmpeq_epi8(_mm256_and_si256(b, low4), bad));
      any = _mm256_or_si256(
          any, _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4), bad));
    }
  }
  bool found = !_mm256_testz_si256(any, any);
  for (; i < data_bytes; ++i) {
    found |= bits == 8 ? data[i] == 0x80 : ((data[i] & 15) == 8) | ((data[i] >> 4) == 8);
  }
  return found;
}

#else  // not x86: never chosen (the 2-bit codec has no AVX2 kernels there either)

bool PackAvx2(const float*, size_t, float, float, int, uint8_t*) { return false; }
void UnpackAvx2(const uint8_t*, size_t, int, float, float*) {}
bool HasInvalidCountAvx2(const uint8_t*, size_t, int) { return true; }

#endif

}  // namespace trellis::packed_internal
