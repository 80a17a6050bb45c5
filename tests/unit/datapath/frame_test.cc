#include "datapath/frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

#include "datapath/le_bytes.h"
#include "tests/testing/test_frames.h"

namespace trellis {
namespace {

using testing::BulkBytes;
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

// The server's sum of a push (AddFloats, vectorized) is bit for bit the scalar sum dst[i] + v[i]
// for every float, special values included, whether the payload is one chunk (the TCP reader's
// buffer, at an unaligned offset) or split anywhere, floats straddling chunks.
TEST(WireTest, AddFloatsIsTheScalarSumBitForBit) {
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), -1e-40f, 3.4e38f, 1.0f};
  uint32_t x = 12345;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  for (size_t count : {0, 1, 7, 8, 9, 31, 1000, 4099}) {
    std::vector<float> v(count), base(count);
    for (size_t i = 0; i < count; ++i) {
      const uint32_t r = next();
      v[i] = r % 7 == 0 ? specials[r % 9] : static_cast<float>(static_cast<int32_t>(r)) * 1e-9f;
      base[i] = next() % 11 == 0 ? specials[x % 9] : static_cast<float>(x % 1000) * 0.37f;
    }
    std::vector<uint32_t> want(count);
    for (size_t i = 0; i < count; ++i) {
      volatile float sum = base[i] + v[i];  // the scalar reference, one addition
      const float s = sum;
      std::memcpy(&want[i], &s, sizeof s);
    }
    auto bytes = RequestBytes(wire::Op::kPush, 1, 0, 1, v);
    for (size_t chunk : {1, 3, 6, 13, 64, 4097, 1 << 20}) {
      std::vector<float> sum = base;
      wire::AddFloats(Split(bytes, chunk), wire::kRequestHeaderBytes, count, sum.data());
      for (size_t i = 0; i < count; ++i) {
        uint32_t got;
        std::memcpy(&got, &sum[i], sizeof got);
        ASSERT_EQ(got, want[i]) << "count " << count << " chunk " << chunk << " element " << i;
      }
    }
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
  bad_op[4] = 10;
  st = wire::DecodeRequest(Split(bad_op, 100), &h, &id);
  EXPECT_NE(st.message().find("unknown op 10"), std::string::npos);

  auto odd = RequestBytes(wire::Op::kPush, 1, 0, 1, {1, 2});
  odd.push_back(0);
  odd[40] = 9;  // payload_bytes = 9: not whole floats
  st = wire::DecodeRequest(Split(odd, 100), &h, &id);
  EXPECT_NE(st.message().find("not a whole number of float32"), std::string::npos) << st.message();

  // A 2-bit push's payload is a frame of any length: the frame validator judges it later.
  odd[4] = static_cast<uint8_t>(wire::Op::kPushTwoBit);
  EXPECT_TRUE(wire::DecodeRequest(Split(odd, 100), &h, &id).ok());
  EXPECT_EQ(h.op, wire::Op::kPushTwoBit);
  EXPECT_EQ(h.payload_bytes, 9u);
  // After the packed ones, before save (16), and past the crash-recovery ops (18-21), elastic
  // jobs' world (22) and a server resize's handout and handin (23, 24).
  for (uint8_t op : {10, 15, 25, 255}) {
    bad_op[4] = op;
    st = wire::DecodeRequest(Split(bad_op, 100), &h, &id);
    EXPECT_NE(st.message().find("unknown op " + std::to_string(op)), std::string::npos)
        << st.message();
  }
}

TEST(Wire, TwoBitOpsAreNamedAndClassified) {
  EXPECT_STREQ(wire::OpName(wire::Op::kPushTwoBit), "push2bit");
  EXPECT_STREQ(wire::OpName(wire::Op::kPushPullTwoBit), "pushpull2bit");
  EXPECT_TRUE(wire::IsTwoBit(wire::Op::kPushPullTwoBit));
  EXPECT_FALSE(wire::IsTwoBit(wire::Op::kPushPull));
  EXPECT_TRUE(wire::AnswersWithValues(wire::Op::kPushPullTwoBit));
  EXPECT_FALSE(wire::AnswersWithValues(wire::Op::kPushTwoBit));
  EXPECT_TRUE(wire::OpHasPayload(wire::Op::kPushTwoBit));
  EXPECT_FALSE(wire::OpHasPayload(wire::Op::kPull));
}

TEST(Wire, PackedOpsAreNamedClassifiedAndCheckedInBulks) {
  EXPECT_EQ(static_cast<int>(wire::Op::kPullPacked), 8);
  EXPECT_EQ(static_cast<int>(wire::Op::kPushPullTwoBitPacked), 9);
  EXPECT_STREQ(wire::OpName(wire::Op::kPullPacked), "pullpacked");
  EXPECT_STREQ(wire::OpName(wire::Op::kPushPullTwoBitPacked), "pushpull2bitpacked");
  EXPECT_TRUE(wire::IsTwoBit(wire::Op::kPushPullTwoBitPacked));
  EXPECT_FALSE(wire::IsTwoBit(wire::Op::kPullPacked));
  EXPECT_TRUE(wire::AcceptsPacked(wire::Op::kPullPacked));
  EXPECT_TRUE(wire::AcceptsPacked(wire::Op::kPushPullTwoBitPacked));
  EXPECT_FALSE(wire::AcceptsPacked(wire::Op::kPushPullTwoBit));
  EXPECT_TRUE(wire::AnswersWithValues(wire::Op::kPullPacked));
  EXPECT_TRUE(wire::AnswersWithValues(wire::Op::kPushPullTwoBitPacked));
  EXPECT_FALSE(wire::OpHasPayload(wire::Op::kPullPacked));
  EXPECT_TRUE(wire::OpHasPayload(wire::Op::kPushPullTwoBitPacked));
  EXPECT_FALSE(wire::PayloadIsFloat32(wire::Op::kPushPullTwoBitPacked));

  // A pullpacked carries no payload, alone or in a bulk; both packed ops travel in bulks.
  wire::RequestHeader h;
  uint64_t id;
  Status st = wire::DecodeRequest(Split(RequestBytes(wire::Op::kPullPacked, 1, 0, 1, {1}), 7), &h,
                                  &id);
  EXPECT_EQ(st.message(), "malformed frame: a pullpacked carries no payload, got 4 bytes");
  auto frame = RequestBytes(wire::Op::kPushPullTwoBitPacked, 1, 0, 1, {});
  frame.push_back(7);  // a 1-byte "frame": the 2-bit validator judges it later
  wire::PutLe<uint64_t>(frame.data(), 40, 1);
  auto bulk = BulkBytes({RequestBytes(wire::Op::kPullPacked, 1, 0, 1, {}, 2), frame});
  auto chunks = Split(bulk, 5);
  ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
  std::vector<wire::BulkEntry> entries;
  st = wire::ParseBulk(chunks, wire::kRequestHeaderBytes, h.payload_bytes, &entries);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].header.op, wire::Op::kPullPacked);
  EXPECT_EQ(entries[1].header.op, wire::Op::kPushPullTwoBitPacked);
  bulk = BulkBytes({RequestBytes(wire::Op::kPullPacked, 1, 0, 1, {2}, 2)});
  chunks = Split(bulk, 5);
  ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
  st = wire::ParseBulk(chunks, wire::kRequestHeaderBytes, h.payload_bytes, &entries);
  EXPECT_EQ(st.message(), "malformed bulk: entry 0: a pullpacked carries no payload, got 4 bytes");
}

// The packed flag is byte 5 of the response header: 0 in every float32 answer (so those are
// byte-identical to before), 1 for a packed one, anything else is a malformed response.
TEST(Wire, ResponseHeaderCarriesThePackedFlag) {
  wire::ResponseHeader r;
  r.op = wire::Op::kPushPullTwoBitPacked;
  r.request_id = 3;
  r.payload_bytes = 18;
  uint8_t buf[wire::kResponseHeaderBytes];
  wire::EncodeResponseHeader(r, buf);
  EXPECT_EQ(buf[5], 0);
  r.packed = true;
  wire::EncodeResponseHeader(r, buf);
  EXPECT_EQ(buf[5], 1);
  wire::ResponseHeader back;
  ASSERT_TRUE(wire::ParseResponseHeader(buf, &back).ok());
  EXPECT_TRUE(back.packed);
  EXPECT_EQ(back.payload_bytes, 18u);
  buf[5] = 2;
  Status st = wire::ParseResponseHeader(buf, &back);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_EQ(st.message(), "malformed response: unknown payload encoding 2");
}

TEST(Wire, ContiguousPointsIntoAChunkOrGathers) {
  std::vector<uint8_t> bytes(40);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  auto chunks = Split(bytes, 16);
  std::vector<uint8_t> scratch;
  EXPECT_EQ(wire::Contiguous(chunks, 17, 10, &scratch), bytes.data() + 17);  // inside chunk 1
  EXPECT_TRUE(scratch.empty());
  const uint8_t* p = wire::Contiguous(chunks, 10, 20, &scratch);  // straddles chunks 0-1
  EXPECT_EQ(p, scratch.data());
  EXPECT_EQ(std::vector<uint8_t>(p, p + 20),
            std::vector<uint8_t>(bytes.begin() + 10, bytes.begin() + 30));
}

TEST(WireTest, BulkEntriesParseAcrossOddChunks) {
  auto bytes = BulkBytes({RequestBytes(wire::Op::kPushPull, 1, 0, 3, {1, 2}, 11, -1),
                          RequestBytes(wire::Op::kPull, 2, 4, 3, {}, 12, -1),
                          RequestBytes(wire::Op::kPush, 3, 1, 3, {7, 8, 9}, 13, -2)},
                         10);
  for (size_t chunk : {1, 5, 48, 1000}) {
    auto c = Split(bytes, chunk);
    wire::RequestHeader h;
    uint64_t id = 0;
    ASSERT_TRUE(wire::DecodeRequest(c, &h, &id).ok()) << chunk;
    EXPECT_EQ(h.op, wire::Op::kBulk);
    std::vector<wire::BulkEntry> e;
    ASSERT_TRUE(wire::ParseBulk(c, wire::kRequestHeaderBytes, h.payload_bytes, &e).ok());
    ASSERT_EQ(e.size(), 3u);
    EXPECT_EQ(e[0].header.request_id, 11u);
    EXPECT_EQ(e[1].header.op, wire::Op::kPull);
    EXPECT_EQ(e[2].header.key, 3u);
    // An entry's view holds exactly its own frame: header + payload.
    auto sub = wire::SubChunks(c, e[2].offset, e[2].bytes);
    ASSERT_EQ(wire::TotalBytes(sub), wire::kRequestHeaderBytes + 12);
    std::vector<float> v(3);
    wire::CopyFloats(sub, wire::kRequestHeaderBytes, 3, v.data());
    EXPECT_EQ(v, (std::vector<float>{7, 8, 9}));
  }
}

TEST(WireTest, MalformedBulksAreRejectedWithReasons) {
  auto good = RequestBytes(wire::Op::kPush, 1, 0, 1, {1, 2}, 5);
  auto bad_magic = good;
  bad_magic[0] ^= 0xff;
  auto overrun = good;
  overrun.resize(overrun.size() - 4);  // announces 8 payload bytes, 4 follow
  auto pull_with_payload = RequestBytes(wire::Op::kPull, 1, 0, 1, {1}, 6);
  auto odd = RequestBytes(wire::Op::kPush, 1, 0, 1, {}, 7);
  odd[40] = 3;  // 3 payload bytes
  odd.insert(odd.end(), {1, 2, 3});
  struct Case {
    std::vector<std::vector<uint8_t>> entries;
    const char* text;
  };
  const Case cases[] = {
      {{}, "malformed bulk: no entries"},
      {{good, bad_magic}, "malformed bulk: entry 1: malformed frame: bad magic"},
      {{good, overrun}, "malformed bulk: entry 1: payload of 8 bytes runs past the bulk"},
      {{pull_with_payload}, "malformed bulk: entry 0: a pull carries no payload, got 4 bytes"},
      {{RequestBytes(wire::Op::kInit, 1, 0, 0, {1}, 8)},
       "malformed bulk: entry 0: op init cannot travel in a bulk"},
      {{BulkBytes({good})}, "malformed bulk: entry 0: op bulk cannot travel in a bulk"},
      {{RequestBytes(wire::Op::kWorld, 0, 0, 2, {}, 9)},
       "malformed bulk: entry 0: op world cannot travel in a bulk"},
      {{RequestBytes(wire::Op::kHandOut, 1, 0, 2, {}, 9)},
       "malformed bulk: entry 0: op handout cannot travel in a bulk"},
      {{RequestBytes(wire::Op::kHandIn, 1, 0, 2, {1}, 9)},
       "malformed bulk: entry 0: op handin cannot travel in a bulk"},
      {{good, std::vector<uint8_t>(20, 0)},
       "malformed bulk: entry 1: 20 bytes left, shorter than a request header"},
      {{odd}, "malformed bulk: entry 0: payload of 3 bytes is not a whole number of float32"},
  };
  for (const Case& k : cases) {
    auto bytes = BulkBytes(k.entries);
    auto c = Split(bytes, 7);
    std::vector<wire::BulkEntry> e;
    Status st = wire::ParseBulk(c, wire::kRequestHeaderBytes,
                                bytes.size() - wire::kRequestHeaderBytes, &e);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << k.text;
    EXPECT_NE(st.message().find(k.text), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace trellis
