// The CUDA kernels against the CPU path: same words, same residual bits, same decoded values.
// Skips when the machine has no CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/datapath/codec/twobit_reference.h"
#include "datapath/codec/twobit.h"
#include "worker-lib/cuda/twobit_cuda.h"

namespace trellis {
namespace {

// A device buffer of floats, freed on scope exit; `offset` elements in, to test unaligned pointers.
class DeviceFloats {
 public:
  DeviceFloats(size_t n, size_t offset) : n_(n), offset_(offset) {
    EXPECT_EQ(cudaMalloc(&base_, (n + offset + 1) * sizeof(float)), cudaSuccess);
  }
  ~DeviceFloats() { cudaFree(base_); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  float* get() { return static_cast<float*>(base_) + offset_; }
  void Upload(const std::vector<float>& v) {
    ASSERT_EQ(cudaMemcpy(get(), v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<float> Download() {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), get(), n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  void* base_ = nullptr;
  size_t n_, offset_;
};

class DeviceWords {
 public:
  explicit DeviceWords(size_t words) : words_(words) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&p_), (words + 1) * sizeof(uint32_t)), cudaSuccess);
    cudaMemset(p_, 0xEE, (words + 1) * sizeof(uint32_t));  // poison: every word must be written
  }
  ~DeviceWords() { cudaFree(p_); }
  DeviceWords(const DeviceWords&) = delete;
  DeviceWords& operator=(const DeviceWords&) = delete;
  uint32_t* get() { return p_; }
  std::vector<uint32_t> Download() {
    std::vector<uint32_t> v(words_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, words_ * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  void Upload(const std::vector<uint32_t>& v) {
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(uint32_t), cudaMemcpyHostToDevice), cudaSuccess);
  }

 private:
  uint32_t* p_ = nullptr;
  size_t words_;
};

// Equal bits, except that any NaN equals any NaN (the GPU does not keep NaN payloads).
bool SameValues(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
  }
  return true;
}

class TwoBitCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(TwoBitCuda, QuantizeAndDequantizeMatchTheCpu) {
  const float t = 0.5f;
  for (size_t offset : {0u, 1u}) {  // 1: pointers not 16-byte aligned (scalar kernels)
    for (size_t n : {1u, 15u, 16u, 17u, 1000u, 1000003u}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(offset));
      DeviceFloats d_grad(n, offset), d_residual(n, offset), d_out(n, offset);
      DeviceWords d_words(TwoBitWords(n));
      std::vector<float> residual(n, 0.0f);
      d_residual.Upload(residual);
      for (uint32_t step = 0; step < 3; ++step) {
        // Step 2 with gradients of 4t: the residual's bound [-t, t] cuts many elements.
        const std::vector<float> grad = testing::RandomGradient(n, step == 2 ? 4 * t : t, 500 + step);
        std::vector<uint32_t> words(TwoBitWords(n));
        TwoBitQuantize(grad.data(), residual.data(), n, t, words.data());
        d_grad.Upload(grad);
        ASSERT_TRUE(TwoBitQuantizeCuda(d_grad.get(), d_residual.get(), n, t, d_words.get()).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(d_words.Download(), words) << "step " << step;
        ASSERT_TRUE(testing::SameBits(d_residual.Download(), residual)) << "step " << step;

        std::vector<float> out(n);
        TwoBitDequantizeWords(words.data(), n, t, out.data());
        ASSERT_TRUE(TwoBitDequantizeCuda(d_words.get(), n, t, d_out.get()).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(testing::SameBits(d_out.Download(), out));

        // Add into an accumulator holding the residual (any non-trivial values will do).
        std::vector<float> acc = residual;
        TwoBitDequantizeAddWords(words.data(), n, t, acc.data());
        d_out.Upload(residual);
        ASSERT_TRUE(TwoBitDequantizeAddCuda(d_words.get(), n, t, d_out.get()).ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_TRUE(testing::SameBits(d_out.Download(), acc));
      }
    }
  }
}

TEST_F(TwoBitCuda, NanAndInfBehaveAsOnTheCpu) {
  const float inf = std::numeric_limits<float>::infinity();
  const size_t n = 37;
  std::vector<float> grad(n, 0.1f), residual(n, 0.0f);
  grad[0] = std::numeric_limits<float>::quiet_NaN();
  grad[1] = inf;
  grad[2] = -inf;
  grad[20] = inf;
  residual[20] = -inf;
  grad[36] = std::numeric_limits<float>::quiet_NaN();
  DeviceFloats d_grad(n, 0), d_residual(n, 0);
  DeviceWords d_words(TwoBitWords(n));
  d_grad.Upload(grad);
  d_residual.Upload(residual);
  std::vector<uint32_t> words(TwoBitWords(n));
  TwoBitQuantize(grad.data(), residual.data(), n, 1.0f, words.data());
  ASSERT_TRUE(TwoBitQuantizeCuda(d_grad.get(), d_residual.get(), n, 1.0f, d_words.get()).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_words.Download(), words);
  EXPECT_TRUE(SameValues(d_residual.Download(), residual));
  // What the CPU gives: +Inf sends +t and leaves the residual at t (Inf - t = Inf, bounded to
  // t), -Inf likewise; NaN sends nothing and stays; Inf + -Inf is NaN.
  EXPECT_EQ(words[0] >> 26, (3u << 2) | 2u);  // element 0: 00, 1: 11, 2: 10
  EXPECT_EQ(words[0] >> 30, 0u);
  EXPECT_EQ(residual[1], 1.0f);
  EXPECT_EQ(residual[2], -1.0f);
  EXPECT_TRUE(std::isnan(residual[0]));
  EXPECT_TRUE(std::isnan(residual[20]));
  EXPECT_TRUE(std::isnan(residual[36]));
  EXPECT_EQ(words[1], 0u);  // elements 16..31: 0.1 each, and the NaN of element 20
  EXPECT_EQ(residual[3], 0.1f);
}

TEST_F(TwoBitCuda, RejectsBadArguments) {
  DeviceFloats d(16, 0);
  DeviceWords w(1);
  EXPECT_EQ(TwoBitQuantizeCuda(d.get(), d.get(), 16, 0.0f, w.get()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TwoBitQuantizeCuda(nullptr, d.get(), 16, 1.0f, w.get()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(TwoBitQuantizeCuda(nullptr, nullptr, 0, 1.0f, nullptr).ok());
}

}  // namespace
}  // namespace trellis
