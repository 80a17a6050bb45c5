// Status wrappers around the CUDA launchers (compiled by g++ as C++20 with the rest of Trellis).
#include "worker-lib/cuda/twobit_cuda.h"

#include <string>

#include "datapath/codec/twobit.h"
#include "worker-lib/cuda/twobit_cuda_kernels.h"

namespace trellis {
namespace {

Status CheckArgs(const void* a, const void* b, const void* c, size_t n, float threshold) {
  TRELLIS_RETURN_IF_ERROR(ValidateTwoBitThreshold(threshold));
  if (n > 0 && (a == nullptr || b == nullptr || c == nullptr)) {
    return InvalidArgumentError("2bit cuda: null device pointer");
  }
  return Status::Ok();
}

Status FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

}  // namespace

Status TwoBitQuantizeCuda(const float* grad, float* residual, size_t n, float threshold, uint32_t* words,
                          cudaStream_t stream) {
  TRELLIS_RETURN_IF_ERROR(CheckArgs(grad, residual, words, n, threshold));
  return FromCuda(twobit_cuda_internal::LaunchQuantize(grad, residual, n, threshold, words, stream),
                  "2bit cuda quantize launch");
}

Status TwoBitDequantizeCuda(const uint32_t* words, size_t n, float threshold, float* out, cudaStream_t stream) {
  TRELLIS_RETURN_IF_ERROR(CheckArgs(words, out, out, n, threshold));
  return FromCuda(twobit_cuda_internal::LaunchDequantize(words, n, threshold, out, false, stream),
                  "2bit cuda dequantize launch");
}

Status TwoBitDequantizeAddCuda(const uint32_t* words, size_t n, float threshold, float* acc, cudaStream_t stream) {
  TRELLIS_RETURN_IF_ERROR(CheckArgs(words, acc, acc, n, threshold));
  return FromCuda(twobit_cuda_internal::LaunchDequantize(words, n, threshold, acc, true, stream),
                  "2bit cuda dequantize-add launch");
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear it so later calls do not report this one
    return 0;
  }
  return count;
}

}  // namespace trellis
