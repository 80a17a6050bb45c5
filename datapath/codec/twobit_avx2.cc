// AVX2 kernels. Only these functions are compiled for AVX2 (target attribute, not -mavx2), so the
// library still runs on any x86-64 and dispatches at run time. They perform the very same float
// operations as the scalar reference (add, compare, subtract, clamp; no FMA), so bits and
// residuals match it exactly.
#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TRELLIS_TWOBIT_X86 1
#endif

namespace trellis::twobit_internal {

#ifdef TRELLIS_TWOBIT_X86
namespace {

#define TRELLIS_AVX2 __attribute__((target("avx2")))

// 8 elements: updates the residual and returns their codes already shifted into place.
TRELLIS_AVX2 inline __m256i QuantizeHalf(const float* grad, float* residual, __m256 vt, __m256 vnt,
                                         __m256i shifts) {
  const __m256 r = _mm256_add_ps(_mm256_loadu_ps(residual), _mm256_loadu_ps(grad));
  const __m256 ge = _mm256_cmp_ps(r, vt, _CMP_GE_OQ);   // false for NaN
  const __m256 le = _mm256_cmp_ps(r, vnt, _CMP_LE_OQ);  // false for NaN
  const __m256 decoded = _mm256_or_ps(_mm256_and_ps(ge, vt), _mm256_and_ps(le, vnt));
  // Bound to [-t, t] as the scalar ternaries do: MAXPS/MINPS return their second operand when
  // either is NaN, so with `rest` second a NaN stays NaN (and equal values are the same value).
  __m256 rest = _mm256_sub_ps(r, decoded);
  rest = _mm256_max_ps(vnt, rest);  // rest < -t ? -t : rest
  rest = _mm256_min_ps(vt, rest);   // rest >  t ?  t : rest
  _mm256_storeu_ps(residual, rest);
  const __m256i codes = _mm256_or_si256(_mm256_and_si256(_mm256_castps_si256(ge), _mm256_set1_epi32(3)),
                                        _mm256_and_si256(_mm256_castps_si256(le), _mm256_set1_epi32(2)));
  return _mm256_sllv_epi32(codes, shifts);
}

TRELLIS_AVX2 inline uint32_t OrLanes(__m256i v) {
  __m128i x = _mm_or_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0x4E));
  x = _mm_or_si128(x, _mm_shuffle_epi32(x, 0xB1));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(x));
}

TRELLIS_AVX2 void QuantizeAvx2(const float* grad, float* residual, size_t n, float t, uint8_t* words) {
  const __m256 vt = _mm256_set1_ps(t);
  const __m256 vnt = _mm256_set1_ps(-t);
  const __m256i shift_a = _mm256_setr_epi32(30, 28, 26, 24, 22, 20, 18, 16);
  const __m256i shift_b = _mm256_setr_epi32(14, 12, 10, 8, 6, 4, 2, 0);
  const size_t full = n / kTwoBitElementsPerWord;
  for (size_t w = 0; w < full; ++w) {
    const size_t base = w * kTwoBitElementsPerWord;
    const __m256i a = QuantizeHalf(grad + base, residual + base, vt, vnt, shift_a);
    const __m256i b = QuantizeHalf(grad + base + 8, residual + base + 8, vt, vnt, shift_b);
    StoreWord(words + 4 * w, OrLanes(_mm256_or_si256(a, b)));
  }
  const size_t base = full * kTwoBitElementsPerWord;
  if (base < n) StoreWord(words + 4 * full, QuantizeWordScalar(grad + base, residual + base, n - base, t));
}

// The 8 decoded values of one half word.
TRELLIS_AVX2 inline __m256 DecodeHalf(__m256i word, __m256i shifts, __m256 vt, __m256 vnt) {
  const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), _mm256_set1_epi32(3));
  const __m256 pos = _mm256_castsi256_ps(_mm256_cmpeq_epi32(codes, _mm256_set1_epi32(3)));
  const __m256 neg = _mm256_castsi256_ps(_mm256_cmpeq_epi32(codes, _mm256_set1_epi32(2)));
  return _mm256_or_ps(_mm256_and_ps(pos, vt), _mm256_and_ps(neg, vnt));
}

template <bool kAdd>
TRELLIS_AVX2 inline void DequantizeAvx2Impl(const uint8_t* words, size_t n, float t, float* out) {
  const __m256 vt = _mm256_set1_ps(t);
  const __m256 vnt = _mm256_set1_ps(-t);
  const __m256i shift_a = _mm256_setr_epi32(30, 28, 26, 24, 22, 20, 18, 16);
  const __m256i shift_b = _mm256_setr_epi32(14, 12, 10, 8, 6, 4, 2, 0);
  const size_t full = n / kTwoBitElementsPerWord;
  for (size_t w = 0; w < full; ++w) {
    const __m256i word = _mm256_set1_epi32(static_cast<int>(LoadWord(words + 4 * w)));
    float* dst = out + w * kTwoBitElementsPerWord;
    __m256 a = DecodeHalf(word, shift_a, vt, vnt);
    __m256 b = DecodeHalf(word, shift_b, vt, vnt);
    if constexpr (kAdd) {
      a = _mm256_add_ps(_mm256_loadu_ps(dst), a);
      b = _mm256_add_ps(_mm256_loadu_ps(dst + 8), b);
    }
    _mm256_storeu_ps(dst, a);
    _mm256_storeu_ps(dst + 8, b);
  }
  const size_t base = full * kTwoBitElementsPerWord;
  if (base < n) {
    if constexpr (kAdd) {
      DequantizeAddWordScalar(LoadWord(words + 4 * full), n - base, DecodeTable(t), out + base);
    } else {
      DequantizeWordScalar(LoadWord(words + 4 * full), n - base, DecodeTable(t), out + base);
    }
  }
}

TRELLIS_AVX2 void DequantizeAvx2(const uint8_t* words, size_t n, float t, float* out) {
  DequantizeAvx2Impl<false>(words, n, t, out);
}
TRELLIS_AVX2 void DequantizeAddAvx2(const uint8_t* words, size_t n, float t, float* acc) {
  DequantizeAvx2Impl<true>(words, n, t, acc);
}

}  // namespace

const Kernels* Avx2Kernels() {
  static const Kernels kernels{"avx2", QuantizeAvx2, DequantizeAvx2, DequantizeAddAvx2};
  return __builtin_cpu_supports("avx2") ? &kernels : nullptr;
}

#else  // not x86

const Kernels* Avx2Kernels() { return nullptr; }

#endif

}  // namespace trellis::twobit_internal
