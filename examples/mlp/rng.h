// A small, portable random generator: the same seed gives the same numbers on every compiler
// and standard library (std::normal_distribution does not promise that), so the synthetic task
// and the initial weights are reproducible everywhere.
#pragma once

#include <cmath>
#include <cstdint>

namespace trellis::mlp {

// SplitMix64 (Steele, Lea, Flood 2014): tiny state, good enough statistics for data and init.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}

  uint64_t NextU64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t Below(uint64_t n) { return NextU64() % n; }
  // Standard normal (Box-Muller; the second value is dropped to keep the state simple).
  double Normal() {
    double u1 = Uniform();
    double u2 = Uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t state_;
};

// Derives independent streams from one user seed (e.g. per rank, per purpose).
inline uint64_t MixSeed(uint64_t seed, uint64_t stream) {
  Rng r(seed ^ (stream * 0xD1B54A32D192ED03ull));
  return r.NextU64();
}

}  // namespace trellis::mlp
