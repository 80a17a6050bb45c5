// One thread per 4 elements (float4, when the pointers are 16-byte aligned) or per element; the
// 16 codes of a word come from 4 (or 16) adjacent lanes and are ORed with warp shuffles, so all
// global loads and stores are coalesced.
// Compiled by nvcc as C++17: no Trellis headers here (they need C++20); twobit_cuda.cc wraps
// these launchers into the Status API.
#include "worker-lib/cuda/twobit_cuda_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>

namespace trellis::twobit_cuda_internal {
namespace {

constexpr int kBlock = 256;
constexpr size_t kMaxBlocks = 65536;  // the loops stride over the rest

__device__ __forceinline__ uint32_t QuantizeOne(float g, float& res, float t, float neg_t) {
  const float r = __fadd_rn(res, g);
  uint32_t code = 0;
  float decoded = 0.0f;
  if (r >= t) {
    code = 3;
    decoded = t;
  } else if (r <= neg_t) {
    code = 2;
    decoded = neg_t;
  }
  float rest = __fsub_rn(r, decoded);
  // Bound the residual to [-t, t] (the excess is dropped), the CPU's ternaries: NaN stays NaN.
  rest = rest < neg_t ? neg_t : rest;
  rest = rest > t ? t : rest;
  res = rest;
  return code;
}

__device__ __forceinline__ float Decode(uint32_t word, size_t element, float t, float neg_t) {
  const uint32_t code = (word >> (30 - 2 * (element % 16))) & 3u;
  return code == 3 ? t : (code == 2 ? neg_t : 0.0f);
}

// kPer elements per thread: 4 (vector loads; pointers 16-byte aligned) or 1.
template <int kPer>
__global__ void QuantizeKernel(const float* __restrict__ grad, float* __restrict__ residual, size_t n, float t,
                               uint32_t* __restrict__ words) {
  constexpr unsigned kLanesPerWord = 16 / kPer;
  const float neg_t = -t;
  const size_t groups = (n + kPer - 1) / kPer;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  // `base` is the same for the whole block, so every lane of a warp runs the same iterations and
  // takes part in the shuffles.
  for (size_t base = static_cast<size_t>(blockIdx.x) * blockDim.x; base < groups; base += stride) {
    const size_t g = base + threadIdx.x;
    const size_t first = g * kPer;
    uint32_t bits = 0;
    if (g < groups) {
      if (kPer == 4 && first + 4 <= n) {
        const float4 gv = *reinterpret_cast<const float4*>(grad + first);
        float4 rv = *reinterpret_cast<const float4*>(residual + first);
        const int shift = 30 - 2 * static_cast<int>(first % 16);
        bits = QuantizeOne(gv.x, rv.x, t, neg_t) << shift | QuantizeOne(gv.y, rv.y, t, neg_t) << (shift - 2) |
               QuantizeOne(gv.z, rv.z, t, neg_t) << (shift - 4) | QuantizeOne(gv.w, rv.w, t, neg_t) << (shift - 6);
        *reinterpret_cast<float4*>(residual + first) = rv;
      } else {
        for (int j = 0; j < kPer && first + j < n; ++j) {
          float r = residual[first + j];
          bits |= QuantizeOne(grad[first + j], r, t, neg_t) << (30 - 2 * ((first + j) % 16));
          residual[first + j] = r;
        }
      }
    }
    for (unsigned off = 1; off < kLanesPerWord; off <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, off);
    if (g < groups && threadIdx.x % kLanesPerWord == 0) words[first / 16] = bits;
  }
}

template <int kPer, bool kAdd>
__global__ void DequantizeKernel(const uint32_t* __restrict__ words, size_t n, float t, float* __restrict__ out) {
  const float neg_t = -t;
  const size_t groups = (n + kPer - 1) / kPer;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const size_t first = g * kPer;
    const uint32_t word = words[first / 16];
    if (kPer == 4 && first + 4 <= n) {
      float4 v = make_float4(Decode(word, first, t, neg_t), Decode(word, first + 1, t, neg_t),
                             Decode(word, first + 2, t, neg_t), Decode(word, first + 3, t, neg_t));
      if (kAdd) {
        const float4 a = *reinterpret_cast<const float4*>(out + first);
        v = make_float4(__fadd_rn(a.x, v.x), __fadd_rn(a.y, v.y), __fadd_rn(a.z, v.z), __fadd_rn(a.w, v.w));
      }
      *reinterpret_cast<float4*>(out + first) = v;
    } else {
      for (int j = 0; j < kPer && first + j < n; ++j) {
        const float v = Decode(word, first + j, t, neg_t);
        out[first + j] = kAdd ? __fadd_rn(out[first + j], v) : v;
      }
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned Blocks(size_t groups) {
  return static_cast<unsigned>(std::min(kMaxBlocks, (groups + kBlock - 1) / kBlock));
}

}  // namespace

cudaError_t LaunchQuantize(const float* grad, float* residual, size_t n, float threshold, uint32_t* words,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (Aligned16(grad) && Aligned16(residual)) {
    QuantizeKernel<4><<<Blocks((n + 3) / 4), kBlock, 0, stream>>>(grad, residual, n, threshold, words);
  } else {
    QuantizeKernel<1><<<Blocks(n), kBlock, 0, stream>>>(grad, residual, n, threshold, words);
  }
  return cudaGetLastError();
}

cudaError_t LaunchDequantize(const uint32_t* words, size_t n, float threshold, float* out, bool add,
                             cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const bool vec = Aligned16(out);
  const unsigned blocks = vec ? Blocks((n + 3) / 4) : Blocks(n);
  if (vec && add) {
    DequantizeKernel<4, true><<<blocks, kBlock, 0, stream>>>(words, n, threshold, out);
  } else if (vec) {
    DequantizeKernel<4, false><<<blocks, kBlock, 0, stream>>>(words, n, threshold, out);
  } else if (add) {
    DequantizeKernel<1, true><<<blocks, kBlock, 0, stream>>>(words, n, threshold, out);
  } else {
    DequantizeKernel<1, false><<<blocks, kBlock, 0, stream>>>(words, n, threshold, out);
  }
  return cudaGetLastError();
}

}  // namespace trellis::twobit_cuda_internal
