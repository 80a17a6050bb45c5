// An independent, deliberately plain reference of the 2-bit format for the tests: one element at
// a time, codes collected in a vector and packed separately (no shared code with the library).
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace trellis::testing {

// Quantizes like the spec says; returns one code (0, 2 or 3) per element.
inline std::vector<uint32_t> ReferenceCodes(const std::vector<float>& grad, std::vector<float>& residual,
                                            float t) {
  std::vector<uint32_t> codes(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    const float sum = residual[i] + grad[i];
    float sent = 0.0f;
    if (sum >= t) {
      codes[i] = 3;
      sent = t;
    } else if (sum <= -t) {
      codes[i] = 2;
      sent = -t;
    }
    float rest = sum - sent;
    // The bound: the residual stays within [-t, t] (NaN fails both tests and stays NaN).
    if (rest < -t) rest = -t;
    if (rest > t) rest = t;
    residual[i] = rest;
  }
  return codes;
}

// Element i goes to word i / 16, most significant pair first.
inline std::vector<uint32_t> ReferencePack(const std::vector<uint32_t>& codes) {
  std::vector<uint32_t> words((codes.size() + 15) / 16, 0);
  for (size_t i = 0; i < codes.size(); ++i) {
    const unsigned position_in_word = static_cast<unsigned>(i % 16);
    words[i / 16] |= codes[i] << (32 - 2 * (position_in_word + 1));
  }
  return words;
}

inline float ReferenceValue(uint32_t code, float t) { return code == 3 ? t : code == 2 ? -t : 0.0f; }

// Gradients around the threshold, with a few exact hits, zeros of both signs and denormals.
inline std::vector<float> RandomGradient(size_t n, float t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, t);
  std::uniform_int_distribution<int> pick(0, 99);
  std::vector<float> g(n);
  for (auto& v : g) {
    const int p = pick(rng);
    if (p == 0) {
      v = t;
    } else if (p == 1) {
      v = -t;
    } else if (p == 2) {
      v = -0.0f;
    } else if (p == 3) {
      v = 1e-40f;  // denormal
    } else {
      v = normal(rng);
    }
  }
  return g;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace trellis::testing
