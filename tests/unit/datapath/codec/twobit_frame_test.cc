// The wire frame: encoder errors and a decoder that rejects every malformed frame with a clear
// message, leaves the output untouched, and handles unaligned buffers.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/datapath/codec/twobit_reference.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

std::vector<uint8_t> MakeFrame(size_t n, float t, uint32_t seed) {
  const std::vector<float> grad = testing::RandomGradient(n, t, seed);
  std::vector<float> residual(n, 0.0f);
  std::vector<uint8_t> frame(TwoBitEncodedBytes(n));
  EXPECT_TRUE(TwoBitEncode(grad.data(), residual.data(), n, t, frame.data(), frame.size()).ok());
  return frame;
}

// Expects a rejection whose message contains `what`, with the output left as it was.
void ExpectRejected(const std::vector<uint8_t>& frame, size_t n, const std::string& what) {
  std::vector<float> out(n, 42.0f);
  const Status st = TwoBitDequantize(frame.data(), frame.size(), out.data(), n);
  ASSERT_FALSE(st.ok()) << "accepted a frame that should fail with: " << what;
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("2bit frame: "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(what), std::string::npos) << "message: " << st.message();
  const Status add = TwoBitDequantizeAdd(frame.data(), frame.size(), out.data(), n);
  EXPECT_EQ(add, st);
  for (float v : out) ASSERT_EQ(v, 42.0f) << "output written despite the error";
}

void Put32(std::vector<uint8_t>& frame, size_t offset, uint32_t v) { std::memcpy(frame.data() + offset, &v, 4); }
void PutFloat(std::vector<uint8_t>& frame, size_t offset, float v) { std::memcpy(frame.data() + offset, &v, 4); }

TEST(TwoBitFrame, ParseReturnsHeaderFields) {
  const std::vector<uint8_t> frame = MakeFrame(37, 0.125f, 1);
  auto parsed = TwoBitParse(frame.data(), frame.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(parsed->count, 37u);
  EXPECT_EQ(parsed->threshold, 0.125f);
  EXPECT_EQ(parsed->words, frame.data() + kTwoBitHeaderBytes);
  EXPECT_TRUE(TwoBitParse(frame.data(), frame.size(), 37).ok());
}

TEST(TwoBitFrame, EmptySliceIsAHeaderOnly) {
  std::vector<uint8_t> frame(TwoBitEncodedBytes(0));
  EXPECT_EQ(frame.size(), kTwoBitHeaderBytes);
  ASSERT_TRUE(TwoBitEncode(nullptr, nullptr, 0, 1.0f, frame.data(), frame.size()).ok());
  EXPECT_TRUE(TwoBitDequantize(frame.data(), frame.size(), nullptr, 0).ok());
}

TEST(TwoBitFrame, RejectsTruncatedHeader) {
  const std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 2);
  ExpectRejected({}, 20, "truncated header: 0 bytes, need at least 16");
  ExpectRejected(std::vector<uint8_t>(frame.begin(), frame.begin() + 15), 20, "truncated header: 15 bytes");
}

TEST(TwoBitFrame, RejectsTruncatedAndOversizedBodies) {
  std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 3);  // 16 + 8 bytes
  ExpectRejected(std::vector<uint8_t>(frame.begin(), frame.end() - 1), 20,
                 "truncated: 23 bytes, 24 expected for 20 elements");
  ExpectRejected(std::vector<uint8_t>(frame.begin(), frame.end() - 4), 20, "truncated: 20 bytes");
  std::vector<uint8_t> longer = frame;
  longer.push_back(0);
  ExpectRejected(longer, 20, "oversized: 25 bytes, 24 expected for 20 elements");
}

TEST(TwoBitFrame, RejectsBadMagicVersionAndReservedField) {
  std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 4);
  std::vector<uint8_t> bad = frame;
  bad[0] = 'X';
  ExpectRejected(bad, 20, "bad magic 0x42325258, want 0x42325254");
  bad = frame;
  bad[4] = 2;
  ExpectRejected(bad, 20, "unsupported version 2");
  bad = frame;
  bad[7] = 1;
  ExpectRejected(bad, 20, "reserved header field is 256, must be 0");
}

TEST(TwoBitFrame, RejectsBadThresholds) {
  const std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 5);
  for (float t : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    std::vector<uint8_t> bad = frame;
    PutFloat(bad, 8, t);
    ExpectRejected(bad, 20, "threshold must be finite and > 0");
  }
}

TEST(TwoBitFrame, RejectsACountOtherThanExpected) {
  const std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 6);
  ExpectRejected(frame, 21, "element count 20 does not match the expected 21");
  // A huge count from a peer is refused from the header alone, without touching the body.
  std::vector<uint8_t> bad = frame;
  Put32(bad, 12, 0xFFFFFFFFu);
  ExpectRejected(bad, 20, "element count 4294967295 does not match the expected 20");
  auto parsed = TwoBitParse(bad.data(), bad.size());
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("truncated: 24 bytes, 1073741840 expected for 4294967295 elements"),
            std::string::npos)
      << parsed.status().message();
}

TEST(TwoBitFrame, RejectsCode01AndNamesTheElement) {
  std::vector<uint8_t> frame = MakeFrame(40, 1.0f, 7);
  // Element 21 is word 1, position 5: bits 21..20. Set them to 01.
  uint32_t word = 0;
  std::memcpy(&word, frame.data() + 16 + 4, 4);
  word = (word & ~(3u << 20)) | (1u << 20);
  Put32(frame, 16 + 4, word);
  ExpectRejected(frame, 40, "invalid code 01 at element 21");
  // In the partial last word (elements 32..39): element 38 is position 6, bits 19..18.
  frame = MakeFrame(40, 1.0f, 7);
  std::memcpy(&word, frame.data() + 16 + 8, 4);
  Put32(frame, 16 + 8, (word & ~(3u << 18)) | (1u << 18));
  ExpectRejected(frame, 40, "invalid code 01 at element 38");
}

TEST(TwoBitFrame, RejectsNonZeroPadding) {
  std::vector<uint8_t> frame = MakeFrame(20, 1.0f, 8);  // word 1 holds elements 16..19, then padding
  uint32_t word = 0;
  std::memcpy(&word, frame.data() + 16 + 4, 4);
  Put32(frame, 16 + 4, word | (3u << 22));  // element 20, i.e. position 4 of word 1
  ExpectRejected(frame, 20, "nonzero padding after element count 20");
  Put32(frame, 16 + 4, word | 1u);  // a 01 in the padding is padding too
  ExpectRejected(frame, 20, "nonzero padding");
}

TEST(TwoBitFrame, DecodesFromUnalignedBuffers) {
  const size_t n = 1001;
  const std::vector<uint8_t> frame = MakeFrame(n, 0.5f, 9);
  std::vector<float> want(n);
  ASSERT_TRUE(TwoBitDequantize(frame.data(), frame.size(), want.data(), n).ok());
  for (size_t shift = 1; shift < 4; ++shift) {
    std::vector<uint8_t> buffer(frame.size() + shift);
    std::memcpy(buffer.data() + shift, frame.data(), frame.size());
    std::vector<float> out(n);
    ASSERT_TRUE(TwoBitDequantize(buffer.data() + shift, frame.size(), out.data(), n).ok());
    EXPECT_EQ(out, want);
  }
}

TEST(TwoBitFrame, DequantizeAddSumsPushesIntoTheAccumulator) {
  const size_t n = 50;
  const float t = 0.5f;
  std::vector<float> acc(n, 1.0f), want(n, 1.0f);
  for (uint32_t worker = 0; worker < 3; ++worker) {
    const std::vector<uint8_t> frame = MakeFrame(n, t, 100 + worker);
    std::vector<float> decoded(n);
    ASSERT_TRUE(TwoBitDequantize(frame.data(), frame.size(), decoded.data(), n).ok());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(decoded[i] == 0.0f || decoded[i] == t || decoded[i] == -t);
      want[i] += decoded[i];
    }
    ASSERT_TRUE(TwoBitDequantizeAdd(frame.data(), frame.size(), acc.data(), n).ok());
  }
  EXPECT_EQ(acc, want);
}

TEST(TwoBitFrame, EncodeRejectsBadArgumentsWithoutTouchingTheResidual) {
  const size_t n = 20;
  std::vector<float> grad(n, 5.0f), residual(n, 0.25f);
  std::vector<uint8_t> frame(TwoBitEncodedBytes(n) - 1, 0xAB);
  Status st = TwoBitEncode(grad.data(), residual.data(), n, 1.0f, frame.data(), frame.size());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("payload buffer has 23 bytes, 24 needed for 20 elements"), std::string::npos)
      << st.message();
  st = TwoBitEncode(grad.data(), residual.data(), n, -1.0f, frame.data(), frame.size());
  EXPECT_NE(st.message().find("threshold must be finite and > 0, got -1"), std::string::npos) << st.message();
  for (float r : residual) EXPECT_EQ(r, 0.25f);
  for (uint8_t b : frame) EXPECT_EQ(b, 0xAB);
}

}  // namespace
}  // namespace trellis
