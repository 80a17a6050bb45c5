// Portable kernels: the reference for bits and residuals, and the fallback on any CPU.
#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"

namespace trellis::twobit_internal {
namespace {

// Full words with a constant count (unrolled by the compiler), then the partial last word.
void QuantizeScalar(const float* grad, float* residual, size_t n, float t, uint8_t* words) {
  const size_t full = n / kTwoBitElementsPerWord;
  for (size_t w = 0; w < full; ++w) {
    const size_t base = w * kTwoBitElementsPerWord;
    StoreWord(words + 4 * w, QuantizeWordScalar(grad + base, residual + base, kTwoBitElementsPerWord, t));
  }
  const size_t base = full * kTwoBitElementsPerWord;
  if (base < n) StoreWord(words + 4 * full, QuantizeWordScalar(grad + base, residual + base, n - base, t));
}

void DequantizeScalar(const uint8_t* words, size_t n, float t, float* out) {
  const DecodeTable table(t);
  const size_t full = n / kTwoBitElementsPerWord;
  for (size_t w = 0; w < full; ++w) {
    DequantizeWordScalar(LoadWord(words + 4 * w), kTwoBitElementsPerWord, table, out + w * kTwoBitElementsPerWord);
  }
  const size_t base = full * kTwoBitElementsPerWord;
  if (base < n) DequantizeWordScalar(LoadWord(words + 4 * full), n - base, table, out + base);
}

void DequantizeAddScalar(const uint8_t* words, size_t n, float t, float* acc) {
  const DecodeTable table(t);
  const size_t full = n / kTwoBitElementsPerWord;
  for (size_t w = 0; w < full; ++w) {
    DequantizeAddWordScalar(LoadWord(words + 4 * w), kTwoBitElementsPerWord, table,
                            acc + w * kTwoBitElementsPerWord);
  }
  const size_t base = full * kTwoBitElementsPerWord;
  if (base < n) DequantizeAddWordScalar(LoadWord(words + 4 * full), n - base, table, acc + base);
}

}  // namespace

const Kernels& ScalarKernels() {
  static const Kernels kernels{"scalar", QuantizeScalar, DequantizeScalar, DequantizeAddScalar};
  return kernels;
}

}  // namespace trellis::twobit_internal
