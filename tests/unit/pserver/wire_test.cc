#include "pserver/wire.h"

#include <gtest/gtest.h>

#include "tests/unit/pserver/test_frames.h"

namespace trellis {
namespace {

using testing::RequestBytes;
using testing::Split;

TEST(WireTest, RequestRoundTripAcrossOddChunks) {
  std::vector<float> v = {1.5f, -2.25f, 3.0f, 4.125f, 5.0f};
  auto bytes = RequestBytes(wire::Op::kPushPull, 77, 3, 9, v, 42, -4);
  for (size_t chunk : {1, 3, 7, 13, 48, 1000}) {
    auto c = Split(bytes, chunk);
    wire::RequestHeader h;
    uint64_t id = 0;
    ASSERT_TRUE(wire::DecodeRequest(c, &h, &id).ok()) << chunk;
    EXPECT_EQ(h.op, wire::Op::kPushPull);
    EXPECT_EQ(h.request_id, 42u);
    EXPECT_EQ(h.key, 77u);
    EXPECT_EQ(h.slice, 3u);
    EXPECT_EQ(h.step, 9);
    EXPECT_EQ(h.priority, -4);
    std::vector<float> copy(v.size());
    wire::CopyFloats(c, wire::kRequestHeaderBytes, v.size(), copy.data());
    EXPECT_EQ(copy, v);
    std::vector<float> sum(v.size(), 1.0f);
    wire::AddFloats(c, wire::kRequestHeaderBytes, v.size(), sum.data());
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(sum[i], v[i] + 1.0f);
  }
}

TEST(WireTest, GarbageIsRejectedWithReasons) {
  wire::RequestHeader h;
  uint64_t id = 99;
  std::vector<uint8_t> shortf(7, 0xab);
  auto st = wire::DecodeRequest(Split(shortf, 100), &h, &id);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("shorter than the 48-byte request header"), std::string::npos);
  EXPECT_EQ(id, 0u);

  auto bytes = RequestBytes(wire::Op::kPush, 1, 0, 1, {1, 2, 3}, 5);
  auto bad_magic = bytes;
  bad_magic[0] ^= 0xff;
  st = wire::DecodeRequest(Split(bad_magic, 100), &h, &id);
  EXPECT_NE(st.message().find("bad magic"), std::string::npos);
  EXPECT_EQ(id, 5u);

  auto truncated = bytes;
  truncated.resize(truncated.size() - 4);
  st = wire::DecodeRequest(Split(truncated, 100), &h, &id);
  EXPECT_NE(st.message().find("announces 12 payload bytes, 8 present"), std::string::npos)
      << st.message();

  auto bad_op = bytes;
  bad_op[4] = 9;
  st = wire::DecodeRequest(Split(bad_op, 100), &h, &id);
  EXPECT_NE(st.message().find("unknown op 9"), std::string::npos);

  auto odd = RequestBytes(wire::Op::kPush, 1, 0, 1, {1, 2});
  odd.push_back(0);
  odd[40] = 9;  // payload_bytes = 9: not whole floats
  st = wire::DecodeRequest(Split(odd, 100), &h, &id);
  EXPECT_NE(st.message().find("not a whole number of float32"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace trellis
