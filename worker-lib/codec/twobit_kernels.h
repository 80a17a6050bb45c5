// Internal to the codec: the CPU kernels behind twobit.h and the dispatch between them.
// Words are little-endian 32-bit values at any byte alignment (frames come from the network).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace trellis::twobit_internal {

static_assert(std::endian::native == std::endian::little,
              "the 2-bit frame stores words little-endian and the kernels store host words");

inline uint32_t LoadWord(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}
inline void StoreWord(uint8_t* p, uint32_t w) { std::memcpy(p, &w, sizeof(w)); }

// One word's worth (count <= 16 elements) with the reference operation order; the SIMD kernels
// use it for the tail so every path shares the same float operations.
inline uint32_t QuantizeWordScalar(const float* grad, float* residual, size_t count, float t) {
  const float neg_t = -t;
  uint32_t word = 0;
  for (size_t j = 0; j < count; ++j) {
    const float r = residual[j] + grad[j];
    uint32_t code = 0;
    float decoded = 0.0f;
    if (r >= t) {
      code = 3;
      decoded = t;
    } else if (r <= neg_t) {
      code = 2;
      decoded = neg_t;
    }
    residual[j] = r - decoded;  // subtract even 0.0f, as the SIMD path does
    word |= code << (30 - 2 * j);
  }
  return word;
}

inline float DecodeCode(uint32_t code, float t) {
  return code == 3 ? t : (code == 2 ? -t : 0.0f);
}

inline void DequantizeWordScalar(uint32_t word, size_t count, float t, float* out) {
  for (size_t j = 0; j < count; ++j) out[j] = DecodeCode((word >> (30 - 2 * j)) & 3u, t);
}
inline void DequantizeAddWordScalar(uint32_t word, size_t count, float t, float* acc) {
  for (size_t j = 0; j < count; ++j) acc[j] = acc[j] + DecodeCode((word >> (30 - 2 * j)) & 3u, t);
}

struct Kernels {
  const char* name;
  void (*quantize)(const float* grad, float* residual, size_t n, float t, uint8_t* words);
  void (*dequantize)(const uint8_t* words, size_t n, float t, float* out);
  void (*dequantize_add)(const uint8_t* words, size_t n, float t, float* acc);
};

const Kernels& ScalarKernels();
// nullptr when this build or this CPU has no AVX2.
const Kernels* Avx2Kernels();
// The kernels the public functions use (chosen once).
const Kernels& ActiveKernels();
// The dispatch rule, pure for tests: scalar when forced (env value "1") or when AVX2 is absent.
bool ChooseScalar(const char* force_scalar_env, bool have_avx2);

}  // namespace trellis::twobit_internal
