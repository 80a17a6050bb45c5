// CUDA kernels of the 2-bit codec (see datapath/codec/twobit.h for the format). They produce
// the same words and the same residuals, bit for bit, as the CPU kernels (__fadd_rn/__fsub_rn:
// no fused operations), except that NaN payloads are not preserved (a NaN stays a NaN).
//
// All pointers are device pointers; words are TwoBitWords(n) host-order (little-endian) 32-bit
// words, i.e. the words of a frame after its 16-byte header. Work is enqueued on `stream` and
// the functions return without waiting; errors are argument errors and launch errors.
// The decoders do no validation: validate a frame on the host first (TwoBitParse /
// TwoBitValidateWords, cheap: 1/16 of the data); a 01 code decodes as 0 here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/base/status.h"

namespace trellis {

Status TwoBitQuantizeCuda(const float* grad, float* residual, size_t n, float threshold, uint32_t* words,
                          cudaStream_t stream = nullptr);
Status TwoBitDequantizeCuda(const uint32_t* words, size_t n, float threshold, float* out,
                            cudaStream_t stream = nullptr);
Status TwoBitDequantizeAddCuda(const uint32_t* words, size_t n, float threshold, float* acc,
                               cudaStream_t stream = nullptr);

// Number of CUDA devices; 0 when there is no device or no usable driver (never an error).
int CudaDeviceCount();

}  // namespace trellis
