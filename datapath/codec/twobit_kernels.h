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
  const float decoded[4] = {0.0f, 0.0f, neg_t, t};  // by code
  uint32_t word = 0;
  for (size_t j = 0; j < count; ++j) {
    const float r = residual[j] + grad[j];
    // Flags and a table rather than branches: gradients make branches unpredictable.
    const uint32_t pos = r >= t;
    const uint32_t neg = r <= neg_t;
    const uint32_t code = ((pos | neg) << 1) | pos;
    float rest = r - decoded[code];  // subtract even 0.0f, as the SIMD path does
    // Bound the residual to [-t, t]; the excess is dropped. NaN compares false and stays NaN
    // (the AVX2 path: max(-t, rest) then min(t, rest), which keep the second operand on NaN).
    rest = rest < neg_t ? neg_t : rest;
    rest = rest > t ? t : rest;
    residual[j] = rest;
    word |= code << (30 - 2 * j);
  }
  return word;
}

// Values of the codes 00, 01 (invalid: decoded as 0; frames are validated first), 10, 11.
struct DecodeTable {
  float value[4];
  explicit DecodeTable(float t) : value{0.0f, 0.0f, -t, t} {}
};

inline void DequantizeWordScalar(uint32_t word, size_t count, const DecodeTable& table, float* out) {
  for (size_t j = 0; j < count; ++j) out[j] = table.value[(word >> (30 - 2 * j)) & 3u];
}
inline void DequantizeAddWordScalar(uint32_t word, size_t count, const DecodeTable& table, float* acc) {
  for (size_t j = 0; j < count; ++j) acc[j] = acc[j] + table.value[(word >> (30 - 2 * j)) & 3u];
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
