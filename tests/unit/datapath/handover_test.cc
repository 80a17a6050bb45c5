// A moved slice's state on the wire (datapath/handover.h): the part named first, the state block
// read back as written, and anything else refused with a clear error.
#include "datapath/handover.h"

#include <cstring>

#include <gtest/gtest.h>

#include "datapath/le_bytes.h"
#include "tests/testing/test_frames.h"

namespace trellis::wire {
namespace {

using trellis::testing::Split;

TEST(HandoverWireTest, TheStateBlockReadsBackAsWritten) {
  HandoverState s;
  s.complete = (int64_t{1} << 40) + 3;
  s.step_base = 1200;
  s.initialized = true;
  s.has_m = true;
  s.has_v = true;
  uint8_t block[kHandoverStateBytes];
  EncodeHandoverState(s, block);
  HandoverState back;
  ASSERT_TRUE(ParseHandoverState(block, &back).ok());
  EXPECT_EQ(back.complete, s.complete);
  EXPECT_EQ(back.step_base, 1200);
  EXPECT_TRUE(back.initialized && back.has_m && back.has_v);
  EXPECT_EQ(HandoverPartsOf(back), 7u);
  back.has_m = back.has_v = false;
  EXPECT_EQ(HandoverPartsOf(back), 1u);
  // Values follow the block once a result exists: step 0's broadcast, or (aggregate mode, no
  // broadcast) a completed step.
  EXPECT_TRUE(HandoverCarriesValues(back));
  back.initialized = false;
  EXPECT_TRUE(HandoverCarriesValues(back));
  back.complete = 0;
  EXPECT_FALSE(HandoverCarriesValues(back));
  EXPECT_STREQ(OpName(Op::kHandOut), "handout");
  EXPECT_STREQ(OpName(Op::kHandIn), "handin");
  EXPECT_TRUE(IsKnownOp(23) && IsKnownOp(24));
  EXPECT_FALSE(IsKnownOp(25));
  EXPECT_TRUE(AnswersWithValues(Op::kHandOut));
  EXPECT_FALSE(AnswersWithValues(Op::kHandIn));
}

TEST(HandoverWireTest, BadStateBlocksAndPartsAreRefused) {
  HandoverState good;
  good.initialized = true;
  good.complete = 4;
  uint8_t block[kHandoverStateBytes];
  const auto refused = [&](auto change, const char* text) {
    EncodeHandoverState(good, block);
    change(block);
    HandoverState out;
    Status st = ParseHandoverState(block, &out);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(st.message().find(text), std::string::npos) << st.message();
  };
  refused([](uint8_t* b) { b[0] = 'X'; }, "does not start with TRH1");
  refused([](uint8_t* b) { PutLe<uint32_t>(b, 4, 9); }, "unknown state flags 9");
  refused([](uint8_t* b) { PutLe<int64_t>(b, 8, -1); }, "negative step (complete -1");
  refused([](uint8_t* b) { PutLe<int64_t>(b, 16, -5); }, "step base -5");
  refused([](uint8_t* b) { b[31] = 1; }, "reserved bytes are not zero");
  refused([](uint8_t* b) { PutLe<uint32_t>(b, 4, 2); }, "a slice never initialized has no optimizer state");

  auto bytes = EncodeHandoverPart(HandoverPart::kOptimizerV);
  auto part = ParseHandoverPart(Split(bytes, 1), 0, bytes.size());
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(*part, HandoverPart::kOptimizerV);
  EXPECT_STREQ(HandoverPartName(*part), "optimizer v");
  auto short_part = ParseHandoverPart(Split(bytes, 1), 0, 3);
  EXPECT_EQ(short_part.status().message(), "handover: 3 payload bytes, shorter than the 4-byte part");
  bytes[0] = 3;
  EXPECT_EQ(ParseHandoverPart(Split(bytes, 2), 0, 4).status().message(), "handover: unknown part 3");
}

}  // namespace
}  // namespace trellis::wire
