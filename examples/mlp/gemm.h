// Dense float kernels for the MLP: row-major, single-threaded, portable (-O2/-O3 without
// -march=native, so the inner loops vectorize with whatever SIMD the baseline ISA has).
#pragma once

#include <cstdint>

namespace trellis::mlp {

// C[m x n] += A[m x k] * B[k x n]; all row-major with leading dimensions equal to their widths.
// C must not alias A or B.
void GemmAccumulate(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c);

// out[cols x rows] = in[rows x cols]^T.
void Transpose(int64_t rows, int64_t cols, const float* in, float* out);

}  // namespace trellis::mlp
