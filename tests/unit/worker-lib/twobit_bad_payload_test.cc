// Compressed pushes with bad 2-bit frames, over each transport (gRPC stream, raw TCP) against an
// in-process parameter server: every bad frame is answered INVALID_ARGUMENT naming the problem,
// does not count as the worker's push, and the server keeps serving that connection and others;
// the same for the ops that accept a packed answer, and their packed answers.
#include <cstring>
#include <shared_mutex>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "datapath/tcp/wire.h"
#include "tests/testing/slice_reply.h"
#include "tests/testing/test_pserver.h"
#include "datapath/codec/packed_sum.h"
#include "datapath/codec/twobit.h"
#include "worker-lib/src/server_connection.h"

namespace trellis {
namespace {

using testing::ReplyBox;

constexpr char kToken[] = "twobit-token";
constexpr int64_t kTimeoutMs = 10000;
constexpr int64_t kN = 20;  // not a multiple of 16: the last word has padding
constexpr float kT = 0.5f;

// A valid frame for gradient {+1, -1, 0.1, +1, -1, 0.1, ...} (codes 11 10 00 ...).
std::vector<uint8_t> GoodFrame(int64_t n = kN) {
  std::vector<float> g(n), residual(n, 0.0f);
  for (int64_t i = 0; i < n; ++i) g[i] = i % 3 == 0 ? 1.0f : (i % 3 == 1 ? -1.0f : 0.1f);
  std::vector<uint8_t> f(TwoBitEncodedBytes(n));
  EXPECT_TRUE(TwoBitEncode(g.data(), residual.data(), n, kT, f.data(), f.size()).ok());
  return f;
}
std::vector<float> GoodValues() {
  std::vector<float> v(kN);
  for (int64_t i = 0; i < kN; ++i) v[i] = i % 3 == 0 ? kT : (i % 3 == 1 ? -kT : 0.0f);
  return v;
}

class TwoBitBadPayloadTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    PserverOptions o = testing::TestPserverOptions(kToken);
    o.slice_bytes = 1 << 20;
    auto ps = testing::StartTestPserver(o, {testing::FloatKey(7, kN, "fc1")},
                                        testing::MapInstall::kByTest);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
    map_ = std::move(ps->map);
  }
  std::unique_ptr<ServerConnection> Connect() {
    ConnectionOptions o;
    o.token = kToken;
    o.slice_bytes = 1 << 20;
    o.timeout_ms = kTimeoutMs;
    auto c = testing::ConnectTestPserver(*ps_, GetParam(), std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->InstallShardMap(map_, 0, kTimeoutMs).ok());
    return std::move(*c);
  }
  // A compressed PushPull of `frame` at `step`; the answer lands in *out (or ReplyBox::values).
  void Send(ServerConnection& c, std::vector<uint8_t> frame, int64_t step, ReplyBox* a,
            std::vector<float>* out, wire::Op op = wire::Op::kPushPullTwoBit) {
    SliceRequest r;
    r.op = op;
    r.key = 7;
    r.step = step;
    r.encoded = std::make_shared<const std::vector<uint8_t>>(std::move(frame));
    r.out = out->data();
    r.out_elements = kN;
    r.out_mu = &out_mu_;
    r.out_closed = &out_closed_;
    c.Send(r, a->Reply());
    ASSERT_TRUE(a->Wait());
  }
  void ExpectServes(ServerConnection& c, int64_t step) {
    ReplyBox a;
    std::vector<float> out(kN, -9.0f);
    Send(c, GoodFrame(), step, &a, &out);
    ASSERT_TRUE(a.status.ok()) << a.status.ToString();
    EXPECT_EQ(a.values.empty() ? out : a.values, GoodValues());
  }

  std::unique_ptr<ParameterServer> ps_;
  v1::ShardMap map_;
  std::shared_mutex out_mu_;
  std::atomic<bool> out_closed_{false};
};
INSTANTIATE_TEST_SUITE_P(Transports, TwoBitBadPayloadTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

TEST_P(TwoBitBadPayloadTest, BadFramesGetInvalidArgumentAndTheServerKeepsServing) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const std::vector<uint8_t> good = GoodFrame();
  auto with = [&](auto edit) {
    std::vector<uint8_t> f = good;
    edit(f);
    return f;
  };
  struct Case {
    const char* name;
    std::vector<uint8_t> frame;
    const char* text;
  };
  const float nan = std::nanf("");
  std::vector<Case> cases = {
      {"wrong count", GoodFrame(kN - 1), "element count 19 does not match the expected 20"},
      {"truncated by a byte", with([](auto& f) { f.pop_back(); }), "truncated: 23 bytes"},
      {"truncated by a word", with([](auto& f) { f.resize(f.size() - 4); }), "truncated: 20 bytes"},
      {"oversized", with([](auto& f) { f.resize(f.size() + 4); }), "oversized"},
      {"header only, short", std::vector<uint8_t>(good.begin(), good.begin() + 9),
       "truncated header"},
      {"empty", {}, "truncated header"},
      {"garbage", std::vector<uint8_t>(24, 0xA5), "bad magic"},
      {"code 01", with([](auto& f) { f[16 + 3] = (f[16 + 3] & 0x3F) | 0x40; }),
       "invalid code 01 at element 0"},
      {"padding", with([](auto& f) { f[16 + 4] |= 0x03; }), "nonzero padding"},
      {"nan threshold", with([&](auto& f) { std::memcpy(f.data() + 8, &nan, 4); }), "threshold"},
  };
  for (const Case& k : cases) {
    for (wire::Op op : {wire::Op::kPushPullTwoBit, wire::Op::kPushPullTwoBitPacked}) {
      ReplyBox a;
      std::vector<float> out(kN, -9.0f);
      Send(*c, k.frame, 1, &a, &out, op);
      const std::string what = std::string(k.name) + " (" + wire::OpName(op) + "): " +
                               a.status.ToString();
      EXPECT_EQ(a.status.code(), StatusCode::kInvalidArgument) << what;
      EXPECT_NE(a.status.message().find(k.text), std::string::npos) << what;
      EXPECT_NE(a.status.message().find("key 7 (fc1) slice 0"), std::string::npos) << what;
      EXPECT_EQ(out, std::vector<float>(kN, -9.0f)) << k.name;
    }
  }
  // None of them counted as the push of step 1; the same connection and a new one go on.
  ExpectServes(*c, 1);
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  ExpectServes(*other, 2);
}

// Ops that accept a packed answer get one over either transport (W = 1: every push of the step
// is 2-bit), flagged in the response header and never read in place; a bulk carries them too.
TEST_P(TwoBitBadPayloadTest, PackedAnswersArriveFlaggedOverBothTransports) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ReplyBox a;
  std::vector<float> out(kN, -9.0f);
  Send(*c, GoodFrame(), 1, &a, &out, wire::Op::kPushPullTwoBitPacked);
  ASSERT_TRUE(a.status.ok()) << a.status.ToString();
  ASSERT_EQ(a.packed.size(), PackedSumBytes(kN, 4));
  EXPECT_EQ(out, std::vector<float>(kN, -9.0f));  // the worker decodes, not the transport
  std::vector<float> decoded(kN);
  ASSERT_TRUE(UnpackSum(a.packed.data(), a.packed.size(), kN, decoded.data()).ok());
  EXPECT_EQ(decoded, GoodValues());
  // In a bulk: a pushpull2bitpacked of step 2 and a pullpacked of step 1.
  std::vector<SliceRequest> rs(2);
  rs[0].op = wire::Op::kPushPullTwoBitPacked;
  rs[0].key = 7;
  rs[0].step = 2;
  rs[0].encoded = std::make_shared<const std::vector<uint8_t>>(GoodFrame());
  rs[1].op = wire::Op::kPullPacked;
  rs[1].key = 7;
  rs[1].step = 1;
  std::vector<float> out0(kN), out1(kN);
  for (size_t i = 0; i < 2; ++i) {
    rs[i].out = i == 0 ? out0.data() : out1.data();
    rs[i].out_elements = kN;
    rs[i].out_mu = &out_mu_;
    rs[i].out_closed = &out_closed_;
  }
  ReplyBox a0, a1;
  c->SendBulk(rs, {a0.Reply(), a1.Reply()}, nullptr);
  ASSERT_TRUE(a0.Wait() && a1.Wait());
  ASSERT_TRUE(a0.status.ok() && a1.status.ok()) << a0.status.ToString() << a1.status.ToString();
  EXPECT_EQ(a0.packed, a.packed);  // the same gradient, the same sum
  EXPECT_EQ(a1.packed, a.packed);
}

// 2-bit pushes travel in bulks (docs/compression.md): a good and a truncated frame in one bulk;
// the bad entry gets its own INVALID_ARGUMENT, the good one is served.
TEST_P(TwoBitBadPayloadTest, TwoBitEntriesInABulkAreServedOneByOne) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<uint8_t> bad = GoodFrame();
  bad.resize(bad.size() - 3);  // truncated: not a multiple of 4 either
  std::vector<SliceRequest> rs(2);
  rs[0].op = wire::Op::kPushTwoBit;
  rs[0].key = 7;
  rs[0].step = 1;
  rs[0].encoded = std::make_shared<const std::vector<uint8_t>>(std::move(bad));
  rs[1].op = wire::Op::kPushTwoBit;
  rs[1].key = 7;
  rs[1].step = 1;
  rs[1].encoded = std::make_shared<const std::vector<uint8_t>>(GoodFrame());
  ReplyBox a0, a1;
  c->SendBulk(rs, {a0.Reply(), a1.Reply()}, nullptr);
  rs.clear();  // the transport holds the frames until they were sent
  ASSERT_TRUE(a0.Wait() && a1.Wait());
  EXPECT_EQ(a0.status.code(), StatusCode::kInvalidArgument) << a0.status.ToString();
  EXPECT_TRUE(a1.status.ok()) << a1.status.ToString();
  // The good entry counted as the worker's step-1 push: the step-1 pull answers its values.
  ReplyBox p;
  std::vector<float> out(kN, -9.0f);
  SliceRequest r;
  r.op = wire::Op::kPull;
  r.key = 7;
  r.step = 1;
  r.out = out.data();
  r.out_elements = kN;
  r.out_mu = &out_mu_;
  r.out_closed = &out_closed_;
  c->Send(r, p.Reply());
  ASSERT_TRUE(p.Wait());
  ASSERT_TRUE(p.status.ok()) << p.status.ToString();
  EXPECT_EQ(p.values.empty() ? out : p.values, GoodValues());
}

}  // namespace
}  // namespace trellis
