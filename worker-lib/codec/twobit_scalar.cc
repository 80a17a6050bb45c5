// Portable kernels: the reference for bits and residuals, and the fallback on any CPU.
#include "worker-lib/codec/twobit.h"
#include "worker-lib/codec/twobit_kernels.h"

namespace trellis::twobit_internal {
namespace {

void QuantizeScalar(const float* grad, float* residual, size_t n, float t, uint8_t* words) {
  const size_t nwords = TwoBitWords(n);
  for (size_t w = 0; w < nwords; ++w) {
    const size_t base = w * kTwoBitElementsPerWord;
    const size_t count = n - base < kTwoBitElementsPerWord ? n - base : kTwoBitElementsPerWord;
    StoreWord(words + 4 * w, QuantizeWordScalar(grad + base, residual + base, count, t));
  }
}

void DequantizeScalar(const uint8_t* words, size_t n, float t, float* out) {
  const size_t nwords = TwoBitWords(n);
  for (size_t w = 0; w < nwords; ++w) {
    const size_t base = w * kTwoBitElementsPerWord;
    const size_t count = n - base < kTwoBitElementsPerWord ? n - base : kTwoBitElementsPerWord;
    DequantizeWordScalar(LoadWord(words + 4 * w), count, t, out + base);
  }
}

void DequantizeAddScalar(const uint8_t* words, size_t n, float t, float* acc) {
  const size_t nwords = TwoBitWords(n);
  for (size_t w = 0; w < nwords; ++w) {
    const size_t base = w * kTwoBitElementsPerWord;
    const size_t count = n - base < kTwoBitElementsPerWord ? n - base : kTwoBitElementsPerWord;
    DequantizeAddWordScalar(LoadWord(words + 4 * w), count, t, acc + base);
  }
}

}  // namespace

const Kernels& ScalarKernels() {
  static const Kernels kernels{"scalar", QuantizeScalar, DequantizeScalar, DequantizeAddScalar};
  return kernels;
}

}  // namespace trellis::twobit_internal
