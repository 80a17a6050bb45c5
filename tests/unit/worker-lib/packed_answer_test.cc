// The worker's check of a packed answer before it writes anything: the request must have
// accepted one, the count must be the slice's, and the bytes (split across chunks as a transport
// hands them over) must be a well-formed packed answer.
#include "worker-lib/src/packed_answer.h"

#include <gtest/gtest.h>

#include "tests/testing/test_frames.h"

namespace trellis {
namespace {

std::vector<uint8_t> Packed(const std::vector<float>& sum, float t, int bits) {
  std::vector<uint8_t> out(PackedSumBytes(sum.size(), bits));
  EXPECT_TRUE(PackSum(sum.data(), sum.size(), t, bits, out.data(), out.size()).ok());
  return out;
}

// The payload as a transport hands it over: after a 7-byte prefix, split into 3-byte chunks.
struct Handed {
  std::vector<uint8_t> bytes;
  wire::Chunks chunks;
  Payload payload;
  explicit Handed(const std::vector<uint8_t>& answer) {
    bytes.assign(7, 0xEE);
    bytes.insert(bytes.end(), answer.begin(), answer.end());
    chunks = testing::Split(bytes, 3);
    payload = Payload{&chunks, 7, answer.size(), false, true};
  }
};

TEST(PackedAnswer, AGoodAnswerSplitAcrossChunksDecodes) {
  const std::vector<float> sum = {0.5f, -1.0f, 0, 1.5f, -0.5f};
  Handed h(Packed(sum, 0.5f, 4));
  std::vector<uint8_t> scratch;
  auto view = ParsePackedAnswer(h.payload, true, 5 * 4, &scratch);
  ASSERT_TRUE(view.ok()) << view.status().message();
  std::vector<float> out(5);
  UnpackParsedSum(*view, out.data());
  EXPECT_EQ(out, sum);
}

TEST(PackedAnswer, EveryBadAnswerIsRefusedWithItsReason) {
  const std::vector<float> sum = {0.5f, -1.0f, 0, 1.5f, -0.5f};
  const auto good = Packed(sum, 0.5f, 4);
  std::vector<uint8_t> scratch;
  auto reason = [&](const std::vector<uint8_t>& answer, bool accepted, int64_t want_bytes) {
    Handed h(answer);
    auto view = ParsePackedAnswer(h.payload, accepted, want_bytes, &scratch);
    EXPECT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), StatusCode::kInvalidArgument);
    return std::string(view.status().message());
  };
  EXPECT_EQ(reason(good, false, 20), "answered packed to a request that accepts no packed answer");
  EXPECT_EQ(reason(good, true, 24), "packed answer: element count 5 does not match the expected 6");
  auto cut = good;
  cut.pop_back();
  EXPECT_EQ(reason(cut, true, 20),
            "packed answer: truncated: 18 bytes, 19 expected for 5 elements of 4 bits");
  auto wide = good;
  wide[6] = 16;
  EXPECT_EQ(reason(wide, true, 20), "packed answer: unsupported width of 16 bits, want 4 or 8");
  auto garbage = std::vector<uint8_t>(good.size(), 0x5A);
  EXPECT_NE(reason(garbage, true, 20).find("packed answer: bad magic"), std::string::npos);
  EXPECT_NE(reason({}, true, 20).find("truncated header: 0 bytes"), std::string::npos);
}

}  // namespace
}  // namespace trellis
