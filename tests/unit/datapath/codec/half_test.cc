// The 16-bit codec (datapath/codec/half.h): conversions against exact references, frames,
// and the coded-frame dispatch the server uses (2-bit and 16-bit frames by their magic).
#include "datapath/codec/half.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "datapath/codec/coded_frame.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

// The float16 nearest to v by exhaustive search over the finite codes (ties to the even code),
// +-Inf beyond 65520 (the midpoint between 65504 and the next power): the IEEE rule, spelled out.
uint16_t NearestFloat16(float v) {
  const double x = v;
  if (std::fabs(x) >= 65520.0) return x > 0 ? 0x7C00 : 0xFC00;
  uint16_t best = 0;
  double best_err = INFINITY;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7C00) == 0x7C00) continue;  // Inf and NaN
    const double d = HalfToFloat(HalfType::kFloat16, static_cast<uint16_t>(h));
    const double err = std::fabs(d - x);
    if (err < best_err || (err == best_err && (h & 1) == 0 && (best & 1) == 1)) {
      if (d == 0 && std::signbit(d) != std::signbit(x)) continue;  // keep the sign of zero
      best = static_cast<uint16_t>(h);
      best_err = err;
    }
  }
  return best;
}

TEST(Half, Float16DecodesEveryCodeExactly) {
  // Normal codes: (-1)^s 2^(e-15) (1 + m/1024); subnormals 2^-14 m/1024.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float got = HalfToFloat(HalfType::kFloat16, static_cast<uint16_t>(h));
    if (e == 31) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << h;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1024 + m, e - 25);
    ASSERT_EQ(static_cast<double>(got), want) << "code " << h;
    // And back: every finite code round-trips.
    ASSERT_EQ(FloatToHalf(HalfType::kFloat16, got), h) << "code " << h;
  }
}

TEST(Half, Float16RoundsToNearestEven) {
  const float cases[] = {0.1f, -0.1f, 1.0f / 3, 65504.0f, 65519.0f, 65520.0f, 1e6f, -1e6f,
                         5.9604645e-8f, 2.9802322e-8f, 2.98023259e-8f, 1e-9f, 1.00048828125f,
                         1.00146484375f, 3.14159265f, -2.71828f, 6.1e-5f, 0.0f, -0.0f};
  for (float v : cases) EXPECT_EQ(FloatToHalf(HalfType::kFloat16, v), NearestFloat16(v)) << v;
  // Ties: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10 -> the even code (1.0).
  EXPECT_EQ(FloatToHalf(HalfType::kFloat16, 1.00048828125f), 0x3C00);
  EXPECT_EQ(FloatToHalf(HalfType::kFloat16, 1.00146484375f), 0x3C02);
  EXPECT_EQ(FloatToHalf(HalfType::kFloat16, 65520.0f), 0x7C00);  // overflow -> +Inf
  EXPECT_EQ(FloatToHalf(HalfType::kFloat16, std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(HalfToFloat(HalfType::kFloat16,
                                     FloatToHalf(HalfType::kFloat16, std::nanf("")))));
}

TEST(Half, BFloat16RoundsToNearestEvenAndKeepsNaN) {
  auto bits = [](uint32_t u) { return std::bit_cast<float>(u); };
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, 1.0f), 0x3F80);
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, bits(0x3F808000)), 0x3F80);  // tie -> even
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, bits(0x3F818000)), 0x3F82);  // tie -> even
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, bits(0x3F808001)), 0x3F81);  // above the tie
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, 3e38f), 0x7F62);
  EXPECT_EQ(FloatToHalf(HalfType::kBFloat16, bits(0x7F7FFFFF)), 0x7F80);  // rounds up to Inf
  EXPECT_TRUE(std::isnan(HalfToFloat(HalfType::kBFloat16, FloatToHalf(HalfType::kBFloat16,
                                                                      bits(0x7F800001)))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // decoding is exact: the high half of a float32
    const float f = HalfToFloat(HalfType::kBFloat16, static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(f), h << 16);
  }
}

TEST(Half, FrameRoundTripAndLayout) {
  const std::vector<float> g = {1.0f, -2.5f, 0.333f, 1e-3f, 257.0f};
  for (HalfType t : {HalfType::kFloat16, HalfType::kBFloat16}) {
    std::vector<uint8_t> f;
    ASSERT_TRUE(HalfEncode(t, g.data(), g.size(), &f).ok());
    ASSERT_EQ(f.size(), 16 + 2 * g.size());
    EXPECT_EQ(std::memcmp(f.data(), "TR16", 4), 0);
    EXPECT_EQ(f[6], static_cast<uint8_t>(t));
    auto parsed = ParseCodedFrame(f.data(), f.size(), g.size());
    ASSERT_TRUE(parsed.ok()) << parsed.status().message();
    EXPECT_TRUE(parsed->is_half);
    EXPECT_EQ(PackThreshold(*parsed), 0.0f);  // a sum of 16-bit pushes is never packed
    std::vector<float> out(g.size()), acc(g.size(), 0.5f);
    DecodeCodedFrame(*parsed, out.data());
    DecodeAddCodedFrame(*parsed, acc.data());
    for (size_t i = 0; i < g.size(); ++i) {
      const float want = HalfToFloat(t, FloatToHalf(t, g[i]));
      EXPECT_EQ(out[i], want);
      EXPECT_EQ(acc[i], 0.5f + want);
    }
  }
}

TEST(Half, ServerSumsInFloat32) {
  // 60000 + 60000 overflows float16 (max 65504) and 256 + 1 needs 9 significant bits
  // (bfloat16 has 8): the float32 sum of the decoded pushes keeps both exact.
  auto sum = [](HalfType t, float x, float y) {
    std::vector<uint8_t> a, b;
    EXPECT_TRUE(HalfEncode(t, &x, 1, &a).ok());
    EXPECT_TRUE(HalfEncode(t, &y, 1, &b).ok());
    float acc = 0;
    DecodeCodedFrame(*ParseCodedFrame(a.data(), a.size(), 1), &acc);
    DecodeAddCodedFrame(*ParseCodedFrame(b.data(), b.size(), 1), &acc);
    return acc;
  };
  EXPECT_EQ(sum(HalfType::kFloat16, 60000.0f, 60000.0f), 120000.0f);
  EXPECT_EQ(sum(HalfType::kBFloat16, 256.0f, 1.0f), 257.0f);
}

TEST(Half, BadFramesAreRefusedWithTheReason) {
  const float g[3] = {1, 2, 3};
  std::vector<uint8_t> f;
  ASSERT_TRUE(HalfEncode(HalfType::kFloat16, g, 3, &f).ok());
  auto msg = [](const std::vector<uint8_t>& b, size_t n) {
    auto r = ParseCodedFrame(b.data(), b.size(), n);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : std::string(r.status().message());
  };
  EXPECT_EQ(msg(f, 4), "16-bit frame: element count 3 does not match the expected 4");
  auto shorter = f;
  shorter.pop_back();
  EXPECT_EQ(msg(shorter, 3), "16-bit frame: 21 bytes, 3 elements need 22");
  auto type = f;
  type[6] = 3;
  EXPECT_EQ(msg(type, 3), "16-bit frame: unknown type 3 (1 float16, 2 bfloat16)");
  auto version = f;
  version[4] = 2;
  EXPECT_EQ(msg(version, 3), "16-bit frame: version 2, this build reads version 1");
  auto reserved = f;
  reserved[13] = 1;
  EXPECT_EQ(msg(reserved, 3), "16-bit frame: reserved bytes not zero");
  EXPECT_EQ(msg(std::vector<uint8_t>(f.begin(), f.begin() + 8), 3),
            "16-bit frame: 8 bytes, shorter than the 16-byte header");
  EXPECT_FALSE(HalfEncode(HalfType::kFloat16, g, 0, &f).ok());
  // Anything else is read as a 2-bit frame, with the 2-bit parser's messages.
  std::vector<uint8_t> tb(TwoBitEncodedBytes(3));
  float residual[3] = {};
  ASSERT_TRUE(TwoBitEncode(g, residual, 3, 0.5f, tb.data(), tb.size()).ok());
  auto parsed = ParseCodedFrame(tb.data(), tb.size(), 3);
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->is_half);
  EXPECT_EQ(PackThreshold(*parsed), 0.5f);
}

}  // namespace
}  // namespace trellis
