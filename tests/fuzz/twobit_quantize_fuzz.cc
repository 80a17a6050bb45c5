// libFuzzer target, differential: the AVX2 quantizer against the scalar one on arbitrary floats
// (NaN, Inf, denormals, -0) and thresholds. Words must be identical and residuals identical bit
// for bit (NaN compared as NaN: payloads are not part of the contract).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"
#include "tests/fuzz/fuzz_input.h"

namespace internal = trellis::twobit_internal;

namespace {

using trellis_fuzz::Check;

bool SameFloat(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const internal::Kernels* avx2 = internal::Avx2Kernels();
  if (avx2 == nullptr || size < 4) return 0;
  float t = 0;
  std::memcpy(&t, data, 4);
  if (!trellis::ValidateTwoBitThreshold(t).ok()) t = 1.0f;  // the kernels require a valid threshold
  // The rest: pairs (grad, residual).
  const size_t n = (size - 4) / 8;
  std::vector<float> grad(n), r_scalar(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(&grad[i], data + 4 + 8 * i, 4);
    std::memcpy(&r_scalar[i], data + 8 + 8 * i, 4);
  }
  std::vector<float> r_avx2 = r_scalar;
  std::vector<uint8_t> w_scalar(4 * trellis::TwoBitWords(n)), w_avx2(w_scalar.size());
  internal::ScalarKernels().quantize(grad.data(), r_scalar.data(), n, t, w_scalar.data());
  avx2->quantize(grad.data(), r_avx2.data(), n, t, w_avx2.data());
  Check(w_scalar == w_avx2);
  for (size_t i = 0; i < n; ++i) Check(SameFloat(r_scalar[i], r_avx2[i]));
  // What was produced is a valid frame body.
  std::vector<uint32_t> words(trellis::TwoBitWords(n));
  if (!words.empty()) std::memcpy(words.data(), w_scalar.data(), w_scalar.size());
  Check(trellis::TwoBitValidateWords(words.data(), n).ok());
  return 0;
}
