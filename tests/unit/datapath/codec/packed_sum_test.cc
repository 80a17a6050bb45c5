// Packed pull answers: round trips for every width, exactness against the server's float32 sum
// of 2-bit pushes, and a decoder that rejects every malformed answer with a clear message and
// the output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "datapath/codec/packed_sum.h"
#include "datapath/codec/packed_sum_kernels.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

// Counts k in [-max, max], seeded.
std::vector<int32_t> RandomCounts(size_t n, int32_t max, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(-max, max);
  std::vector<int32_t> k(n);
  for (auto& v : k) v = d(gen);
  return k;
}

std::vector<uint8_t> Pack(const std::vector<float>& sum, float t, int bits) {
  std::vector<uint8_t> out(PackedSumBytes(sum.size(), bits));
  const Status st = PackSum(sum.data(), sum.size(), t, bits, out.data(), out.size());
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

TEST(PackedSum, BitsPerWorkerCount) {
  EXPECT_EQ(PackedSumBits(0), 0);
  EXPECT_EQ(PackedSumBits(1), 4);
  EXPECT_EQ(PackedSumBits(7), 4);
  EXPECT_EQ(PackedSumBits(8), 8);
  EXPECT_EQ(PackedSumBits(127), 8);
  EXPECT_EQ(PackedSumBits(128), 0);
  EXPECT_EQ(PackedSumBytes(5, 4), 16u + 3u);
  EXPECT_EQ(PackedSumBytes(5, 8), 16u + 5u);
}

// Every W from 1 to 7 (4 bits) and a few above (8 bits), odd and even lengths: the decoded value
// is exactly float(k) * t, and the table decoder agrees with the reference bit for bit.
TEST(PackedSum, RoundTripEveryWidthAndOddLengths) {
  const float t = 0.1f;
  for (int32_t w : {1, 2, 3, 4, 5, 6, 7, 8, 31, 127}) {
    const int bits = PackedSumBits(w);
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{16}, size_t{1001}}) {
      const auto k = RandomCounts(n, w, static_cast<uint32_t>(w * 1000 + n));
      std::vector<float> sum(n);
      for (size_t i = 0; i < n; ++i) sum[i] = static_cast<float>(k[i]) * t;
      const auto packed = Pack(sum, t, bits);
      std::vector<float> out(n, 42.0f), ref(n, 43.0f);
      const Status st = UnpackSum(packed.data(), packed.size(), n, out.data());
      ASSERT_TRUE(st.ok()) << "W=" << w << " n=" << n << ": " << st.message();
      UnpackSumReference(packed.data(), ref.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::memcmp(&out[i], &sum[i], 4), 0) << "W=" << w << " n=" << n << " i=" << i;
        ASSERT_EQ(std::memcmp(&ref[i], &sum[i], 4), 0) << "W=" << w << " n=" << n << " i=" << i;
      }
    }
  }
}

// The server's float32 sum of W dequantized 2-bit pushes, every order of codes: for t = 0.5
// (a power of two) and for any t with W <= 3 the packed answer decodes to that sum bit for bit.
// With t = 0.1 and W = 4 the float32 sum depends on the order of the pushes (0.1+0.1+0.1-0.1 is
// not 0.1+0.1-0.1+0.1 in float32): the decoded k*t is the correctly rounded true sum, within one
// ulp of every order's float sum, and the same whatever the order.
TEST(PackedSum, ExactAgainstTheServersFloatSumOfTwoBitPushes) {
  for (float t : {0.5f, 0.1f, 0.08f}) {
    for (int32_t w = 2; w <= 4; ++w) {
      int combos = 1;
      for (int i = 0; i < w; ++i) combos *= 3;
      std::vector<float> sum(combos);
      std::vector<int32_t> k(combos);
      for (int c = 0; c < combos; ++c) {
        int x = c;
        for (int i = 0; i < w; ++i, x /= 3) {
          // What TwoBitDequantizeFrame / ...AddFrame do with one code: the first writes, then add.
          const int32_t code = x % 3 - 1;
          const float v = code == 0 ? 0.0f : (code > 0 ? t : -t);
          sum[c] = i == 0 ? v : sum[c] + v;
          k[c] += code;
        }
      }
      const auto packed = Pack(sum, t, PackedSumBits(w));
      std::vector<float> out(combos);
      ASSERT_TRUE(UnpackSum(packed.data(), packed.size(), combos, out.data()).ok());
      int differ = 0;
      for (int c = 0; c < combos; ++c) {
        ASSERT_EQ(out[c], static_cast<float>(k[c]) * t) << "t=" << t << " W=" << w;
        if (std::memcmp(&out[c], &sum[c], 4) != 0) {
          ++differ;
          EXPECT_EQ(std::nextafter(sum[c], out[c]), out[c]) << "more than one ulp apart";
        }
      }
      if (t == 0.5f || w <= 3) {
        EXPECT_EQ(differ, 0) << "t=" << t << " W=" << w;
      }
    }
  }
}

TEST(PackedSum, PackRefusesWhatIsNotASumOfTwoBitPushes) {
  const float t = 0.5f;
  std::vector<uint8_t> out(PackedSumBytes(3, 4));
  const std::vector<float> off = {0.5f, 0.6f, 1.0f};  // 1.2 t
  Status st = PackSum(off.data(), 3, t, 4, out.data(), out.size());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("element 1 (0.6) is not a multiple k*0.5 with |k| <= 7"),
            std::string::npos)
      << st.message();
  const std::vector<float> big = {0, 4.0f, 0};  // k = 8 > 7
  EXPECT_FALSE(PackSum(big.data(), 3, t, 4, out.data(), out.size()).ok());
  std::vector<uint8_t> out8(PackedSumBytes(3, 8));
  EXPECT_TRUE(PackSum(big.data(), 3, t, 8, out8.data(), out8.size()).ok());
  const std::vector<float> nan = {0, std::numeric_limits<float>::quiet_NaN(), 0};
  EXPECT_FALSE(PackSum(nan.data(), 3, t, 8, out8.data(), out8.size()).ok());
  const std::vector<float> inf = {std::numeric_limits<float>::infinity(), 0, 0};
  EXPECT_FALSE(PackSum(inf.data(), 3, t, 8, out8.data(), out8.size()).ok());
  EXPECT_FALSE(PackSum(big.data(), 3, t, 5, out8.data(), out8.size()).ok());
  EXPECT_FALSE(PackSum(big.data(), 3, 0.0f, 8, out8.data(), out8.size()).ok());
  EXPECT_FALSE(PackSum(big.data(), 3, t, 8, out8.data(), out8.size() - 1).ok());
}

// Expects a rejection whose message contains `what`, with the output left as it was.
void ExpectRejected(const std::vector<uint8_t>& packed, size_t n, const std::string& what) {
  std::vector<float> out(n, 42.0f);
  const Status st = UnpackSum(packed.data(), packed.size(), n, out.data());
  ASSERT_FALSE(st.ok()) << "accepted an answer that should fail with: " << what;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("packed answer: ", 0), 0u) << st.message();
  EXPECT_NE(st.message().find(what), std::string::npos) << "message: " << st.message();
  for (float v : out) ASSERT_EQ(v, 42.0f) << "output written despite the error";
}

TEST(PackedSum, DecoderRejectsEveryMalformedAnswer) {
  const std::vector<float> sum = {0.5f, -1.0f, 1.5f, 0, -0.5f};  // k = 1 -2 3 0 -1
  const auto good = Pack(sum, 0.5f, 4);
  ASSERT_EQ(good.size(), 16u + 3u);
  auto with = [&](size_t offset, uint8_t v) {
    auto p = good;
    p[offset] = v;
    return p;
  };
  ExpectRejected({good.begin(), good.begin() + 15}, 5, "truncated header: 15 bytes");
  ExpectRejected(with(0, 'X'), 5, "bad magic 0x4b505258, want 0x4b505254 (\"TRPK\")");
  ExpectRejected(with(4, 2), 5, "unsupported version 2, this build reads version 1");
  ExpectRejected(with(6, 2), 5, "unsupported width of 2 bits, want 4 or 8");
  ExpectRejected(with(6, 32), 5, "unsupported width of 32 bits");
  ExpectRejected(with(7, 1), 5, "reserved header field is 1, must be 0");
  auto nan_t = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_t.data() + 8, &nan, 4);
  ExpectRejected(nan_t, 5, "threshold must be finite and > 0, got nan");
  ExpectRejected(good, 6, "element count 5 does not match the expected 6");
  ExpectRejected({good.begin(), good.end() - 1}, 5,
                 "truncated: 18 bytes, 19 expected for 5 elements of 4 bits");
  auto longer = good;
  longer.push_back(0);
  ExpectRejected(longer, 5, "oversized: 20 bytes, 19 expected");
  // The header says 8 bits: the same bytes are now too short.
  ExpectRejected(with(6, 8), 5, "truncated: 19 bytes, 21 expected for 5 elements of 8 bits");
  ExpectRejected(with(16 + 1, 0x38), 5, "count -8 at element 2 is out of range (|k| <= 7)");
  ExpectRejected(with(16 + 2, 0x1F), 5, "nonzero padding after element count 5");
  const auto good8 = Pack(sum, 0.5f, 8);
  auto bad8 = good8;
  bad8[16 + 4] = 0x80;
  ExpectRejected(bad8, 5, "count -128 at element 4 is out of range (|k| <= 127)");
  std::vector<float> out(5);
  EXPECT_TRUE(UnpackSum(good8.data(), good8.size(), 5, out.data()).ok());
  EXPECT_EQ(out, sum);
}

// The buffer need not be aligned (it comes straight from a network chunk).
TEST(PackedSum, UnalignedBuffers) {
  const std::vector<float> sum = {1.0f, -0.25f, 0.75f};
  const auto packed = Pack(sum, 0.25f, 4);
  std::vector<uint8_t> shifted(packed.size() + 1);
  std::memcpy(shifted.data() + 1, packed.data(), packed.size());
  std::vector<float> out(3);
  ASSERT_TRUE(UnpackSum(shifted.data() + 1, packed.size(), 3, out.data()).ok());
  EXPECT_EQ(out, sum);
}

// The AVX2 kernels (16 elements per iteration, a scalar tail) against the per-element reference:
// every length around the block size, both widths, a threshold that is not a power of two; a
// value that is no count is found wherever it sits (vector body or tail), and so is a code the
// widths never carry.
TEST(PackedSum, Avx2KernelsMatchTheReference) {
  if (!packed_internal::UseAvx2()) GTEST_SKIP() << "no AVX2 kernels on this CPU";
  const float t = 0.3f;
  for (int bits : {4, 8}) {
    const int32_t max = PackedSumMaxCount(bits);
    for (size_t n = 0; n <= 70; ++n) {
      const auto k = RandomCounts(n, max, static_cast<uint32_t>(bits * 100 + n));
      std::vector<float> sum(n);
      for (size_t i = 0; i < n; ++i) sum[i] = static_cast<float>(k[i]) * t;
      std::vector<uint8_t> packed(PackedSumBytes(n, bits), 0);
      ASSERT_TRUE(packed_internal::PackAvx2(sum.data(), n, 1.0f / t, static_cast<float>(max), bits,
                                            packed.data() + kPackedSumHeaderBytes))
          << "bits " << bits << " n " << n;
      // The header as PackSum writes it, then the reference decoder over the kernel's bytes.
      std::vector<uint8_t> whole(packed.size());
      ASSERT_TRUE(PackSum(sum.data(), n, t, bits, whole.data(), whole.size()).ok());
      ASSERT_EQ(std::memcmp(whole.data() + kPackedSumHeaderBytes,
                            packed.data() + kPackedSumHeaderBytes,
                            packed.size() - kPackedSumHeaderBytes), 0) << "bits " << bits << " n " << n;
      std::vector<float> ref(n), out(n, 42.0f);
      UnpackSumReference(whole.data(), ref.data());
      packed_internal::UnpackAvx2(whole.data() + kPackedSumHeaderBytes, n, bits, t, out.data());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(static_cast<float>(k[i]) * t, ref[i]);
        ASSERT_EQ(std::memcmp(&out[i], &ref[i], 4), 0) << "bits " << bits << " n " << n << " i " << i;
      }
      EXPECT_FALSE(packed_internal::HasInvalidCountAvx2(whole.data() + kPackedSumHeaderBytes,
                                                        whole.size() - kPackedSumHeaderBytes, bits));
      for (size_t bad = 0; bad < n; bad += 7) {
        for (float v : {sum[bad] + 0.4f * t, static_cast<float>(max + 1) * t,
                        std::numeric_limits<float>::quiet_NaN()}) {
          auto wrong = sum;
          wrong[bad] = v;
          EXPECT_FALSE(packed_internal::PackAvx2(wrong.data(), n, 1.0f / t, static_cast<float>(max),
                                                 bits, packed.data() + kPackedSumHeaderBytes))
              << "bits " << bits << " n " << n << " element " << bad << " = " << v;
        }
        auto codes = whole;
        uint8_t& byte = codes[kPackedSumHeaderBytes + (bits == 8 ? bad : bad / 2)];
        byte = bits == 8 ? 0x80 : (bad % 2 == 0 ? static_cast<uint8_t>((byte & 0xF0) | 8)
                                                : static_cast<uint8_t>((byte & 0x0F) | 0x80));
        EXPECT_TRUE(packed_internal::HasInvalidCountAvx2(codes.data() + kPackedSumHeaderBytes,
                                                         codes.size() - kPackedSumHeaderBytes, bits))
            << "bits " << bits << " n " << n << " element " << bad;
      }
    }
  }
}

// Thresholds whose inverse is not a normal float (a subnormal t, t above 2^126): packing still
// divides and round-trips (found by the PackedAnswer fuzzer when 1/t replaced the division).
TEST(PackedSum, ExtremeThresholdsRoundTrip) {
  for (float t : {1e-40f, 2e-38f, 1e38f}) {
    const auto k = RandomCounts(37, 3, 5);  // |k| * 1e38 stays finite
    std::vector<float> sum(k.size());
    for (size_t i = 0; i < k.size(); ++i) sum[i] = static_cast<float>(k[i]) * t;
    const auto packed = Pack(sum, t, 4);
    std::vector<float> out(k.size());
    ASSERT_TRUE(UnpackSum(packed.data(), packed.size(), k.size(), out.data()).ok()) << t;
    for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(out[i], sum[i]) << "t " << t << " i " << i;
  }
}

}  // namespace
}  // namespace trellis
