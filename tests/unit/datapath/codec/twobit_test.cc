// The 2-bit kernels: the seed's worked example, a plain reference, both CPU paths, odd lengths,
// the residual's bound and what it keeps exactly, and NaN/Inf.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/datapath/codec/twobit_reference.h"
#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"

namespace trellis {
namespace {

using testing::RandomGradient;
using testing::ReferenceCodes;
using testing::ReferencePack;
using testing::ReferenceValue;
using testing::SameBits;
using twobit_internal::Kernels;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Quantizes with the given kernels into words.
std::vector<uint32_t> Quantize(const Kernels& k, const std::vector<float>& grad, std::vector<float>& residual,
                               float t) {
  std::vector<uint32_t> words(TwoBitWords(grad.size()), 0xDEADBEEF);  // poison: every word is written
  k.quantize(grad.data(), residual.data(), grad.size(), t, reinterpret_cast<uint8_t*>(words.data()));
  return words;
}

// Every kernel set this machine can run, the dispatched one first.
std::vector<const Kernels*> AllKernels() {
  std::vector<const Kernels*> all{&twobit_internal::ActiveKernels(), &twobit_internal::ScalarKernels()};
  if (const Kernels* avx2 = twobit_internal::Avx2Kernels()) all.push_back(avx2);
  return all;
}

// The example of apache/mxnet PR #8662 with threshold 2: codes 00 11 00 10 11 00 00 10 for 8
// elements, i.e. the word 0011 0010 1100 0010 0000 0000 0000 0000. (The PR shows its input as
// an image; this input produces exactly the word the text gives.)
TEST(TwoBitQuantize, SeedWorkedExampleBitForBit) {
  const std::vector<float> grad{0.5f, 2.5f, -1.9f, -2.0f, 2.0f, 1.0f, -0.5f, -4.0f};
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    std::vector<float> residual(grad.size(), 0.0f);
    const std::vector<uint32_t> words = Quantize(*k, grad, residual, 2.0f);
    ASSERT_EQ(words.size(), 1u);
    EXPECT_EQ(words[0], 0b0011'0010'1100'0010'0000'0000'0000'0000u);
    EXPECT_EQ(words[0], 0x32C20000u);
    const std::vector<float> want_residual{0.5f, 0.5f, -1.9f, 0.0f, 0.0f, 1.0f, -0.5f, -2.0f};
    EXPECT_EQ(residual, want_residual);
  }
  // The whole frame, byte for byte.
  std::vector<float> residual(grad.size(), 0.0f);
  std::vector<uint8_t> frame(TwoBitEncodedBytes(grad.size()));
  ASSERT_TRUE(TwoBitEncode(grad.data(), residual.data(), grad.size(), 2.0f, frame.data(), frame.size()).ok());
  const std::vector<uint8_t> want{'T', 'R', '2', 'B', 1, 0, 0, 0,  // magic, version 1, reserved
                                  0, 0, 0, 0x40,                   // 2.0f
                                  8, 0, 0, 0,                      // count
                                  0x00, 0x00, 0xC2, 0x32};         // the word, little-endian
  EXPECT_EQ(frame, want);
  std::vector<float> decoded(grad.size(), 7.0f);
  ASSERT_TRUE(TwoBitDequantize(frame.data(), frame.size(), decoded.data(), decoded.size()).ok());
  EXPECT_EQ(decoded, (std::vector<float>{0, 2, 0, -2, 2, 0, 0, -2}));
}

// The residual carries what was not sent: a steady 0.75 with threshold 2 sends +2 every third step
// (0.75, 1.5, 2.25 -> send, 0.25 left).
TEST(TwoBitQuantize, ResidualCarriesSmallValuesUntilTheyCross) {
  const std::vector<float> grad{0.75f};
  std::vector<float> residual{0.0f};
  std::vector<uint32_t> codes;
  for (int step = 0; step < 6; ++step) {
    codes.push_back(Quantize(twobit_internal::ActiveKernels(), grad, residual, 2.0f)[0] >> 30);
  }
  EXPECT_EQ(codes, (std::vector<uint32_t>{0, 0, 3, 0, 0, 3}));
  EXPECT_FLOAT_EQ(residual[0], 0.5f);
}

TEST(TwoBitQuantize, RandomVectorsMatchTheReferenceOverSteps) {
  const float t = 0.5f;
  for (size_t n : {1u, 15u, 16u, 17u, 31u, 33u, 1000u, 4097u}) {
    for (const Kernels* k : AllKernels()) {
      SCOPED_TRACE(std::string(k->name) + " n=" + std::to_string(n));
      std::vector<float> residual(n, 0.0f), ref_residual(n, 0.0f);
      for (uint32_t step = 0; step < 5; ++step) {
        const std::vector<float> grad = RandomGradient(n, t, 1000 + step * 7 + static_cast<uint32_t>(n));
        const std::vector<uint32_t> words = Quantize(*k, grad, residual, t);
        const std::vector<uint32_t> want = ReferencePack(ReferenceCodes(grad, ref_residual, t));
        ASSERT_EQ(words, want) << "step " << step;
        ASSERT_TRUE(SameBits(residual, ref_residual)) << "step " << step;
      }
    }
  }
}

TEST(TwoBitQuantize, OddLengthsPadWithZeroCodesAndRoundTrip) {
  const float t = 1.0f;
  for (size_t n : {1u, 15u, 16u, 17u, 1000003u}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // All elements large: every real element encodes 11 or 10, so 00 can only be padding.
    std::vector<float> grad = RandomGradient(n, t, 7);
    for (auto& g : grad) g = g >= 0 ? 3.0f : -3.0f;
    std::vector<float> residual(n, 0.0f);
    std::vector<uint8_t> frame(TwoBitEncodedBytes(n));
    EXPECT_EQ(frame.size(), 16 + 4 * ((n + 15) / 16));
    ASSERT_TRUE(TwoBitEncode(grad.data(), residual.data(), n, t, frame.data(), frame.size()).ok());
    uint32_t last = 0;
    std::memcpy(&last, frame.data() + frame.size() - 4, 4);
    const size_t used = n % 16 == 0 ? 16 : n % 16;
    const uint32_t padding_mask = used == 16 ? 0u : (1u << (32 - 2 * used)) - 1;
    EXPECT_EQ(last & padding_mask, 0u);
    std::vector<float> out(n, 99.0f);
    ASSERT_TRUE(TwoBitDequantize(frame.data(), frame.size(), out.data(), n).ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], grad[i] > 0 ? t : -t) << i;
      ASSERT_EQ(residual[i], grad[i] > 0 ? t : -t) << i;  // 3 - 1 = 2, bounded to 1
    }
  }
}

TEST(TwoBitQuantize, Avx2EqualsScalarBitsAndResiduals) {
  const Kernels* avx2 = twobit_internal::Avx2Kernels();
  if (avx2 == nullptr) GTEST_SKIP() << "this CPU has no AVX2";
  const Kernels& scalar = twobit_internal::ScalarKernels();
  for (float t : {0.001f, 0.5f, 3.0f}) {
    for (size_t n : {1u, 15u, 16u, 17u, 100u, 1000003u}) {
      SCOPED_TRACE("t=" + std::to_string(t) + " n=" + std::to_string(n));
      std::vector<float> rs(n, 0.0f), rv(n, 0.0f);
      for (uint32_t step = 0; step < 3; ++step) {
        const std::vector<float> grad = RandomGradient(n, t, 42 + step);
        ASSERT_EQ(Quantize(scalar, grad, rs, t), Quantize(*avx2, grad, rv, t));
        ASSERT_TRUE(SameBits(rs, rv));
        // Decoders agree too, on the same words.
        const std::vector<uint32_t> words = Quantize(scalar, grad, rs, t);
        Quantize(*avx2, grad, rv, t);
        std::vector<float> ds(n, 1.25f), dv(n, 1.25f);
        scalar.dequantize_add(reinterpret_cast<const uint8_t*>(words.data()), n, t, ds.data());
        avx2->dequantize_add(reinterpret_cast<const uint8_t*>(words.data()), n, t, dv.data());
        ASSERT_TRUE(SameBits(ds, dv));
        scalar.dequantize(reinterpret_cast<const uint8_t*>(words.data()), n, t, ds.data());
        avx2->dequantize(reinterpret_cast<const uint8_t*>(words.data()), n, t, dv.data());
        ASSERT_TRUE(SameBits(ds, dv));
      }
    }
  }
}

// Gradients of any finite size: on every path the residual never leaves [-t, t].
TEST(TwoBitQuantize, ResidualStaysWithinTheThreshold) {
  const float t = 0.25f;
  const size_t n = 777;
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    std::vector<float> residual(n, 0.0f);
    for (uint32_t step = 0; step < 50; ++step) {
      // Spreads from t/10 to 10t; step 7 adds FLT_MAX-sized values.
      const float scale = t * (step % 2 == 0 ? 0.1f : 10.0f);
      std::vector<float> grad = RandomGradient(n, scale, step);
      if (step == 7) {
        grad[0] = std::numeric_limits<float>::max();
        grad[n - 1] = -std::numeric_limits<float>::max();
      }
      Quantize(*k, grad, residual, t);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(residual[i]), t) << "step " << step << " element " << i;
      }
    }
  }
}

// While every |grad| < t the bound never cuts anything, so no value is lost: with |residual| <= t
// before the step, r = residual + grad is within [-2t, 2t], so r - (+-t) is exact (Sterbenz) and
// already within [-t, t]. Per step, decoded + new residual == residual + grad, bit for bit, for
// any such gradient; and where the additions are exact too (values on a grid of 2^-12 below 1)
// the sum of everything sent plus the residual is the sum of the gradients, exactly.
TEST(TwoBitQuantize, NothingIsLostWhileEveryGradientIsBelowTheThreshold) {
  const float t = 0.25f;
  const size_t n = 777;
  std::vector<float> sent(n);
  std::vector<uint32_t> words(TwoBitWords(n));
  {  // arbitrary floats below t: each step is exact
    std::vector<float> residual(n, 0.0f);
    for (uint32_t step = 0; step < 200; ++step) {
      std::vector<float> grad = RandomGradient(n, t * 0.5f, step);
      for (auto& g : grad) g = std::fmax(-0.99f * t, std::fmin(0.99f * t, g));
      std::vector<float> before = residual;
      TwoBitQuantize(grad.data(), residual.data(), n, t, words.data());
      TwoBitDequantizeWords(words.data(), n, t, sent.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(sent[i] + residual[i], before[i] + grad[i]) << "step " << step << " element " << i;
        ASSERT_LE(std::fabs(residual[i]), t);
      }
    }
  }
  {  // on a grid: the sums are exact, in float and in double
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> pick(-1023, 1023);  // |grad| <= 1023/4096 < t = 1024/4096
    std::vector<float> residual(n, 0.0f);
    std::vector<double> sum_grad(n, 0.0), sum_sent(n, 0.0);
    for (uint32_t step = 0; step < 500; ++step) {
      std::vector<float> grad(n);
      for (auto& g : grad) g = static_cast<float>(pick(rng)) / 4096.0f;
      TwoBitQuantize(grad.data(), residual.data(), n, t, words.data());
      TwoBitDequantizeWords(words.data(), n, t, sent.data());
      for (size_t i = 0; i < n; ++i) {
        sum_grad[i] += grad[i];
        sum_sent[i] += sent[i];
      }
    }
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(sum_sent[i] + residual[i], sum_grad[i]) << i;
      ASSERT_LE(std::fabs(residual[i]), t) << i;
    }
  }
}

// The bound at work: a steady gradient of 3t sends +t every step and the residual stays at t (the
// other 2t per step are dropped, not queued). When the gradient turns to -3t, the very next step
// sends -t: nothing of the old direction is left to send.
TEST(TwoBitQuantize, ALargeSteadyGradientSendsTheThresholdAndKeepsTheResidualAtIt) {
  const float t = 0.25f;
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    // 17 elements: the vector body and the tail.
    std::vector<float> grad(17, 3 * t), residual(17, 0.0f);
    for (int step = 0; step < 10; ++step) {
      const std::vector<uint32_t> words = Quantize(*k, grad, residual, t);
      EXPECT_EQ(words[0], 0xFFFFFFFFu) << "step " << step;  // 16 codes 11
      EXPECT_EQ(words[1], 3u << 30) << "step " << step;
      for (float r : residual) ASSERT_EQ(r, t) << "step " << step;
    }
    std::fill(grad.begin(), grad.end(), -3 * t);
    const std::vector<uint32_t> words = Quantize(*k, grad, residual, t);
    EXPECT_EQ(words[0], 0xAAAAAAAAu);  // 16 codes 10 at once
    EXPECT_EQ(words[1], 2u << 30);
    for (float r : residual) ASSERT_EQ(r, -t);
  }
}

// Every pair of special values (grad, residual) on every path against the reference: the clamp
// keeps NaN, bounds Inf and FLT_MAX, and leaves -0 and denormals alone.
TEST(TwoBitQuantize, SpecialValuesMatchTheReferenceOnEveryPath) {
  const float t = 0.5f;
  const float max = std::numeric_limits<float>::max();
  const std::vector<float> special{0.0f,  -0.0f, 1e-40f, -1e-40f, t,    -t,   2 * t, -2 * t, 3 * t, -3 * t,
                                   std::nextafter(t, 0.0f), std::nextafter(2 * t, 3 * t), 0.3f, -0.7f,
                                   max,   -max,  kInf,   -kInf,   kNaN};
  std::vector<float> grad, start;
  for (float g : special) {
    for (float r : special) {
      grad.push_back(g);
      start.push_back(r);
    }
  }
  const size_t n = grad.size();
  std::vector<float> ref_residual = start;
  const std::vector<uint32_t> want = ReferencePack(ReferenceCodes(grad, ref_residual, t));
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    std::vector<float> residual = start;
    ASSERT_EQ(Quantize(*k, grad, residual, t), want);
    for (size_t i = 0; i < n; ++i) {
      SCOPED_TRACE("grad " + std::to_string(grad[i]) + " residual " + std::to_string(start[i]));
      if (std::isnan(ref_residual[i])) {
        ASSERT_TRUE(std::isnan(residual[i]));
      } else {
        ASSERT_TRUE(SameBits({residual[i]}, {ref_residual[i]})) << residual[i] << " vs " << ref_residual[i];
        ASSERT_LE(std::fabs(residual[i]), t);
      }
    }
  }
}

TEST(TwoBitQuantize, NanEncodesZeroAndStaysInTheResidual) {
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    // 17 elements so that both the vector body and the tail see the special values.
    std::vector<float> grad(17, 0.0f), residual(17, 0.0f);
    grad[1] = kNaN;
    grad[16] = kNaN;
    residual[2] = kNaN;
    grad[3] = 5.0f;
    for (int step = 0; step < 2; ++step) {
      const std::vector<uint32_t> words = Quantize(*k, grad, residual, 1.0f);
      EXPECT_EQ(words[0], 3u << (30 - 2 * 3));  // element 3 only, both steps
      EXPECT_EQ(words[1], 0u);
      EXPECT_TRUE(std::isnan(residual[1]));
      EXPECT_TRUE(std::isnan(residual[2]));
      EXPECT_TRUE(std::isnan(residual[16]));
      EXPECT_EQ(residual[3], 1.0f);  // 5 + residual - 1, bounded to 1
      grad[1] = grad[16] = 0.0f;  // NaN stays even when the gradient is clean again
    }
  }
}

// +Inf sends +t and leaves the residual at t (Inf - t = Inf, bounded to t), as any r >= 2t does:
// +t every step while the gradient is +Inf, one more step on the residual's t once the gradient
// is clean, then nothing. -Inf likewise with -t; FLT_MAX too (FLT_MAX - t rounds to FLT_MAX).
TEST(TwoBitQuantize, InfinitiesSendTheThresholdAndLeaveTheResidualAtIt) {
  for (const Kernels* k : AllKernels()) {
    SCOPED_TRACE(k->name);
    // 17 elements: the vector body and the tail.
    std::vector<float> grad(17, 0.0f), residual(17, 0.0f);
    grad[0] = kInf;
    grad[1] = -kInf;
    grad[2] = kInf;
    residual[2] = -kInf;  // Inf + -Inf = NaN -> 00, and the NaN stays
    grad[15] = std::numeric_limits<float>::max();
    grad[16] = -kInf;
    for (int step = 0; step < 5; ++step) {
      if (step == 3) grad[0] = grad[1] = grad[2] = grad[15] = grad[16] = 0.0f;
      const std::vector<uint32_t> words = Quantize(*k, grad, residual, 1.0f);
      const bool sends = step <= 3;  // steps 0-2 the gradient, step 3 the residual's t
      EXPECT_EQ(words[0], sends ? (3u << 30) | (2u << 28) | 3u : 0u) << "step " << step;
      EXPECT_EQ(words[1], sends ? 2u << 30 : 0u) << "step " << step;
      const float left = step < 3 ? 1.0f : 0.0f;
      EXPECT_EQ(residual[0], left) << "step " << step;
      EXPECT_EQ(residual[1], -left) << "step " << step;
      EXPECT_TRUE(std::isnan(residual[2])) << "step " << step;
      EXPECT_EQ(residual[15], left) << "step " << step;
      EXPECT_EQ(residual[16], -left) << "step " << step;
    }
  }
}

TEST(TwoBitQuantize, ThresholdMustBeFiniteAndPositive) {
  EXPECT_TRUE(ValidateTwoBitThreshold(0.5f).ok());
  EXPECT_TRUE(ValidateTwoBitThreshold(1e-30f).ok());
  for (float bad : {0.0f, -0.0f, -1.0f, kInf, -kInf, kNaN}) {
    const Status st = ValidateTwoBitThreshold(bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("threshold must be finite and > 0"), std::string::npos) << st.message();
  }
}

TEST(TwoBitDispatch, ScalarWhenForcedOrWithoutAvx2) {
  EXPECT_FALSE(twobit_internal::ChooseScalar(nullptr, true));
  EXPECT_FALSE(twobit_internal::ChooseScalar("0", true));
  EXPECT_FALSE(twobit_internal::ChooseScalar("", true));
  EXPECT_TRUE(twobit_internal::ChooseScalar("1", true));
  EXPECT_TRUE(twobit_internal::ChooseScalar(nullptr, false));
}

// The variable is read once per process, so check it in a fresh one (the "threadsafe" death
// test style re-executes this binary for the statement).
TEST(TwoBitDispatch, EnvironmentForcesTheScalarPath) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TRELLIS_CODEC_FORCE_SCALAR", "1", 1);
        std::_Exit(TwoBitActivePath() == "scalar" ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace trellis
