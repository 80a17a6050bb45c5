#include "examples/mlp/gemm.h"

#include <algorithm>

namespace trellis::mlp {
namespace {

// Blocks sized so a panel of B (kBlockK x kBlockN floats = 64 KiB) stays in L2 and one row
// segment of C (1 KiB) stays in L1 while the k loop streams over it.
constexpr int64_t kBlockK = 64;
constexpr int64_t kBlockN = 256;

// Four rows of C at once: each loaded B vector feeds four multiply-adds, which is what lifts
// this above memory bandwidth. The n loop has no dependencies and auto-vectorizes.
inline void Rows4(int64_t n_len, int64_t k_len, const float* a, int64_t lda, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  float* __restrict c0 = c;
  float* __restrict c1 = c + ldc;
  float* __restrict c2 = c + 2 * ldc;
  float* __restrict c3 = c + 3 * ldc;
  for (int64_t p = 0; p < k_len; ++p) {
    const float a0 = a[p];
    const float a1 = a[lda + p];
    const float a2 = a[2 * lda + p];
    const float a3 = a[3 * lda + p];
    const float* __restrict bp = b + p * ldb;
    for (int64_t j = 0; j < n_len; ++j) {
      const float bv = bp[j];
      c0[j] += a0 * bv;
      c1[j] += a1 * bv;
      c2[j] += a2 * bv;
      c3[j] += a3 * bv;
    }
  }
}

inline void Rows1(int64_t n_len, int64_t k_len, const float* a, const float* b, int64_t ldb,
                  float* c) {
  float* __restrict c0 = c;
  for (int64_t p = 0; p < k_len; ++p) {
    const float a0 = a[p];
    if (a0 == 0.0f) continue;  // ReLU outputs and their gradients are often exactly zero
    const float* __restrict bp = b + p * ldb;
    for (int64_t j = 0; j < n_len; ++j) c0[j] += a0 * bp[j];
  }
}

}  // namespace

void GemmAccumulate(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  for (int64_t k0 = 0; k0 < k; k0 += kBlockK) {
    const int64_t kl = std::min(kBlockK, k - k0);
    for (int64_t n0 = 0; n0 < n; n0 += kBlockN) {
      const int64_t nl = std::min(kBlockN, n - n0);
      int64_t i = 0;
      for (; i + 4 <= m; i += 4) {
        Rows4(nl, kl, a + i * k + k0, k, b + k0 * n + n0, n, c + i * n + n0, n);
      }
      for (; i < m; ++i) Rows1(nl, kl, a + i * k + k0, b + k0 * n + n0, n, c + i * n + n0);
    }
  }
}

void Transpose(int64_t rows, int64_t cols, const float* in, float* out) {
  constexpr int64_t kTile = 32;  // tiles keep both the reads and the writes cache-friendly
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile);
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t col = c0; col < c1; ++col) out[col * rows + r] = in[r * cols + col];
      }
    }
  }
}

}  // namespace trellis::mlp
