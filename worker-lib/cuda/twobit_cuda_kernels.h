// Internal: the kernel launchers behind twobit_cuda.h, in plain C++17 for nvcc. Arguments are
// checked by the callers in twobit_cuda.cc; these only launch (asynchronously, on `stream`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace trellis::twobit_cuda_internal {

cudaError_t LaunchQuantize(const float* grad, float* residual, size_t n, float threshold, uint32_t* words,
                           cudaStream_t stream);
cudaError_t LaunchDequantize(const uint32_t* words, size_t n, float threshold, float* out, bool add,
                             cudaStream_t stream);

}  // namespace trellis::twobit_cuda_internal
