// libFuzzer target, differential: the scalar quantizer against a plain reference of the rule
// (docs/compression.md, "The rule"), and the AVX2 quantizer against the scalar one, on arbitrary
// floats (NaN, Inf, denormals, -0) and thresholds. Words must be identical and residuals
// identical bit for bit (NaN compared as NaN: payloads are not part of the contract), and every
// residual that is not NaN lies within [-t, t].
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

// The rule one element at a time, with branches; returns the code and updates the residual.
uint32_t ReferenceOne(float grad, float& residual, float t) {
  const float r = residual + grad;
  uint32_t code = 0;
  float sent = 0.0f;
  if (r >= t) {
    code = 3;
    sent = t;
  } else if (r <= -t) {
    code = 2;
    sent = -t;
  }
  float rest = r - sent;
  if (rest < -t) rest = -t;  // NaN fails both tests and stays NaN
  if (rest > t) rest = t;
  residual = rest;
  return code;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
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
  std::vector<float> r_ref = r_scalar, r_avx2 = r_scalar;
  std::vector<uint8_t> w_scalar(4 * trellis::TwoBitWords(n)), w_ref(w_scalar.size(), 0);
  internal::ScalarKernels().quantize(grad.data(), r_scalar.data(), n, t, w_scalar.data());

  // The reference, packed 16 codes a word, the first element in the top bits.
  for (size_t i = 0; i < n; ++i) {
    const uint32_t code = ReferenceOne(grad[i], r_ref[i], t);
    uint32_t word = 0;
    std::memcpy(&word, w_ref.data() + 4 * (i / 16), 4);
    word |= code << (30 - 2 * (i % 16));
    std::memcpy(w_ref.data() + 4 * (i / 16), &word, 4);
  }
  Check(w_scalar == w_ref);
  for (size_t i = 0; i < n; ++i) {
    Check(SameFloat(r_scalar[i], r_ref[i]));
    Check(std::isnan(r_scalar[i]) || std::fabs(r_scalar[i]) <= t);
  }

  if (const internal::Kernels* avx2 = internal::Avx2Kernels()) {
    std::vector<uint8_t> w_avx2(w_scalar.size());
    avx2->quantize(grad.data(), r_avx2.data(), n, t, w_avx2.data());
    Check(w_scalar == w_avx2);
    for (size_t i = 0; i < n; ++i) Check(SameFloat(r_scalar[i], r_avx2[i]));
  }
  // What was produced is a valid frame body.
  std::vector<uint32_t> words(trellis::TwoBitWords(n));
  if (!words.empty()) std::memcpy(words.data(), w_scalar.data(), w_scalar.size());
  Check(trellis::TwoBitValidateWords(words.data(), n).ok());
  return 0;
}
