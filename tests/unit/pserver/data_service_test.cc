// The parameter server over real gRPC on 127.0.0.1:0, driven by a raw stream client: every bad
// request gets an error naming the problem and the server keeps serving.
#include <map>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "tests/testing/test_pserver.h"
#include "tests/unit/pserver/raw_stream.h"
#include "tests/testing/test_frames.h"
#include "datapath/le_bytes.h"
#include "trellis/v1/data.grpc.pb.h"
#include "datapath/codec/packed_sum.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

using testing::Answer;
using testing::BulkBytes;
using testing::RawStream;
using testing::RequestBytes;

constexpr char kToken[] = "s3cret-token";

class DataServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PserverOptions o = testing::TestPserverOptions(kToken);
    o.service.pool_threads = 2;
    auto ps = testing::StartTestPserver(o, {testing::FloatKey(7, 4, "fc1")},
                                        testing::MapInstall::kByTest);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
    address_ = "127.0.0.1:" + std::to_string(ps_->port());
    ASSERT_TRUE(Install(ps->map, kToken).ok());
  }
  grpc::Status Install(const v1::ShardMap& m, const std::string& token) {
    auto stub = v1::DataService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("x-trellis-token", token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::InstallShardMapRequest req;
    *req.mutable_shard_map() = m;
    v1::InstallShardMapResponse resp;
    return stub->InstallShardMap(&ctx, req, &resp);
  }
  // A good PushPull on `s` answers the pushed values (W = 1).
  void ExpectServing(RawStream& s, int64_t step) {
    ASSERT_TRUE(s.Write(RequestBytes(wire::Op::kPushPull, 7, 0, step, {1, 2, 3, 4}, 1000 + step)));
    Answer a;
    ASSERT_TRUE(s.Read(&a));
    EXPECT_EQ(a.header.code, 0) << a.message;
    EXPECT_EQ(a.header.request_id, uint64_t(1000 + step));
    EXPECT_EQ(a.values, (std::vector<float>{1, 2, 3, 4}));
  }
  // Sends `bytes`, expects an error frame with `code` and a message containing `text`.
  void ExpectError(RawStream& s, const std::vector<uint8_t>& bytes, int code,
                   const std::string& text) {
    ASSERT_TRUE(s.Write(bytes));
    Answer a;
    ASSERT_TRUE(s.Read(&a));
    EXPECT_EQ(a.header.code, code) << a.message;
    EXPECT_NE(a.message.find(text), std::string::npos) << a.message;
  }

  std::unique_ptr<ParameterServer> ps_;
  std::string address_;
};

TEST_F(DataServiceTest, GoodRequestRoundTrip) {
  RawStream s(address_, kToken, "0");
  ExpectServing(s, 1);
  ExpectServing(s, 2);
  EXPECT_TRUE(s.Finish().ok());
}

// Crash recovery's ops over gRPC (docs/checkpoints.md#crash-recovery-workers): stash, fetch, rejoin;
// malformed ones are INVALID_ARGUMENT and the stream keeps serving.
TEST_F(DataServiceTest, RejoinOpsRoundTripAndMalformedOnesAreRefused) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, RequestBytes(wire::Op::kStash, 7, 0, 9, {1, 2, 3}), 3, "stash of 3 elements");
  ExpectError(s, RequestBytes(wire::Op::kFetch, 7, 0, 9, {1}), 3,
              "malformed frame: a fetch carries no payload");
  ExpectError(s, RequestBytes(wire::Op::kFetch, 7, 0, 9, {}), 5, "nothing stashed for rejoin 9");
  ASSERT_TRUE(s.Write(RequestBytes(wire::Op::kStash, 7, 0, 9, {5, 6, 7, 8})));
  Answer a;
  ASSERT_TRUE(s.Read(&a));
  EXPECT_EQ(a.header.code, 0) << a.message;
  ASSERT_TRUE(s.Write(RequestBytes(wire::Op::kFetch, 7, 0, 9, {})));
  ASSERT_TRUE(s.Read(&a));
  EXPECT_EQ(a.header.code, 0) << a.message;
  EXPECT_EQ(a.values, (std::vector<float>{5, 6, 7, 8}));
  ASSERT_TRUE(s.Write(RequestBytes(wire::Op::kRejoin, 0, 0, 0, {})));
  ASSERT_TRUE(s.Read(&a));
  EXPECT_EQ(a.header.code, 0) << a.message;
  ExpectServing(s, 1);
  EXPECT_TRUE(s.Finish().ok());
}

TEST_F(DataServiceTest, UnknownKey) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, RequestBytes(wire::Op::kPush, 99, 0, 1, {1, 2, 3, 4}), grpc::NOT_FOUND,
              "unknown key 99 (not in the shard map)");
  ExpectServing(s, 1);
}

TEST_F(DataServiceTest, WrongLength) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, RequestBytes(wire::Op::kPushPull, 7, 0, 1, {1, 2, 3, 4, 5}),
              grpc::INVALID_ARGUMENT, "key 7 (fc1) slice 0: pushpull of 5 elements, the slice has 4");
  ExpectServing(s, 1);
}

TEST_F(DataServiceTest, StepOutsideWindow) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, RequestBytes(wire::Op::kPushPull, 7, 0, 5, {1, 2, 3, 4}), grpc::OUT_OF_RANGE,
              "push for step 5 outside the window: the server expects step 1");
  ExpectServing(s, 1);
  ExpectError(s, RequestBytes(wire::Op::kPull, 7, 0, 3, {}), grpc::OUT_OF_RANGE,
              "pull of step 3 outside the window [0, 2]");
}

TEST_F(DataServiceTest, BulkEntriesAreAnsweredOneByOne) {
  RawStream s(address_, kToken, "0");
  ASSERT_TRUE(s.Write(BulkBytes({RequestBytes(wire::Op::kPushPull, 7, 0, 1, {1, 2, 3, 4}, 21),
                                 RequestBytes(wire::Op::kPull, 7, 0, 1, {}, 22),
                                 RequestBytes(wire::Op::kPush, 99, 0, 1, {1}, 23)},
                                20)));
  std::map<uint64_t, Answer> answers;
  for (int i = 0; i < 3; ++i) {
    Answer a;
    ASSERT_TRUE(s.Read(&a));
    answers[a.header.request_id] = a;
  }
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_EQ(answers[21].values, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(answers[22].values, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(answers[23].header.code, grpc::NOT_FOUND) << answers[23].message;  // its own error
  ExpectServing(s, 2);
}

TEST_F(DataServiceTest, MalformedBulkIsRefusedAndTheStreamGoesOn) {
  RawStream s(address_, kToken, "0");
  auto bad = RequestBytes(wire::Op::kPush, 7, 0, 1, {1, 2, 3, 4}, 31);
  bad.resize(bad.size() - 8);
  Answer a;
  ASSERT_TRUE(s.Write(BulkBytes({RequestBytes(wire::Op::kPush, 7, 0, 1, {1, 2, 3, 4}, 30), bad},
                                29)));
  ASSERT_TRUE(s.Read(&a));
  EXPECT_EQ(a.header.request_id, 29u);
  EXPECT_EQ(a.header.code, grpc::INVALID_ARGUMENT);
  EXPECT_NE(a.message.find("malformed bulk: entry 1: payload of 16 bytes runs past the bulk"),
            std::string::npos)
      << a.message;
  ExpectServing(s, 1);  // nothing of the refused bulk was applied: step 1 is still open
}

TEST_F(DataServiceTest, GarbageBytes) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, std::vector<uint8_t>{0xde, 0xad, 0xbe, 0xef, 1, 2, 3}, grpc::INVALID_ARGUMENT,
              "malformed frame: 7 bytes, shorter than the 48-byte request header");
  std::vector<uint8_t> noise(200);
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<uint8_t>(i * 37 + 11);
  ExpectError(s, noise, grpc::INVALID_ARGUMENT, "malformed frame: bad magic");
  auto truncated = RequestBytes(wire::Op::kPush, 7, 0, 1, {1, 2, 3, 4});
  truncated.resize(truncated.size() - 6);
  ExpectError(s, truncated, grpc::INVALID_ARGUMENT, "announces 16 payload bytes, 10 present");
  ExpectServing(s, 1);
}

// The ops that accept a packed answer: malformed requests get INVALID_ARGUMENT naming the
// problem and the stream goes on; a good one is answered packed (W = 1: the step is all 2-bit).
TEST_F(DataServiceTest, PackedOpsMalformedRequestsAndAPackedAnswer) {
  RawStream s(address_, kToken, "0");
  ExpectError(s, RequestBytes(wire::Op::kPullPacked, 7, 0, 1, {1}), grpc::INVALID_ARGUMENT,
              "malformed frame: a pullpacked carries no payload, got 4 bytes");
  ExpectError(s, RequestBytes(wire::Op::kPushPullTwoBitPacked, 7, 0, 1, {1, 2, 3, 4}),
              grpc::INVALID_ARGUMENT,
              "key 7 (fc1) slice 0: pushpull2bitpacked: 2bit frame: bad magic");
  ExpectError(s, RequestBytes(wire::Op::kPushPullTwoBitPacked, 7, 0, 1, {}),
              grpc::INVALID_ARGUMENT, "2bit frame: truncated header: 0 bytes");
  ExpectServing(s, 1);
  // Step 2 as a 2-bit frame of {+t, -t, 0, +t}, t = 0.25.
  const std::vector<float> grad = {0.3f, -0.3f, 0.1f, 1.0f}, sum = {0.25f, -0.25f, 0, 0.25f};
  std::vector<float> residual(4, 0.0f);
  std::vector<uint8_t> frame(TwoBitEncodedBytes(4));
  ASSERT_TRUE(TwoBitEncode(grad.data(), residual.data(), 4, 0.25f, frame.data(), frame.size()).ok());
  auto req = RequestBytes(wire::Op::kPushPullTwoBitPacked, 7, 0, 2, {}, 50);
  req.insert(req.end(), frame.begin(), frame.end());
  wire::PutLe<uint64_t>(req.data(), 40, frame.size());
  ASSERT_TRUE(s.Write(req));
  Answer a;
  ASSERT_TRUE(s.Read(&a));
  ASSERT_EQ(a.header.code, 0) << a.message;
  EXPECT_TRUE(a.header.packed);
  std::vector<float> decoded(4);
  ASSERT_TRUE(UnpackSum(a.payload.data(), a.payload.size(), 4, decoded.data()).ok());
  EXPECT_EQ(decoded, sum);
  // A plain pull of the same step: float32, unflagged.
  ASSERT_TRUE(s.Write(RequestBytes(wire::Op::kPull, 7, 0, 2, {}, 51)));
  ASSERT_TRUE(s.Read(&a));
  EXPECT_FALSE(a.header.packed);
  EXPECT_EQ(a.values, sum);
  ExpectServing(s, 3);
}

TEST_F(DataServiceTest, BadOrMissingTokenEndsTheStream) {
  {
    RawStream bad(address_, "wrong", "0");
    bad.Write(RequestBytes(wire::Op::kPushPull, 7, 0, 1, {1, 2, 3, 4}));
    Answer a;
    EXPECT_FALSE(bad.Read(&a));
    auto st = bad.Finish();
    EXPECT_EQ(st.error_code(), grpc::UNAUTHENTICATED);
    EXPECT_EQ(st.error_message(), "wrong job token");
  }
  {
    RawStream none(address_, "", "0");
    Answer a;
    EXPECT_FALSE(none.Read(&a));
    auto st = none.Finish();
    EXPECT_EQ(st.error_code(), grpc::UNAUTHENTICATED);
    EXPECT_NE(st.error_message().find("missing job token"), std::string::npos);
  }
  v1::ShardMap m;
  auto st = Install(m, "wrong");
  EXPECT_EQ(st.error_code(), grpc::UNAUTHENTICATED);
  RawStream good(address_, kToken, "0");
  ExpectServing(good, 1);
}

TEST_F(DataServiceTest, BadRankEndsTheStream) {
  RawStream s(address_, kToken, "3");
  Answer a;
  EXPECT_FALSE(s.Read(&a));
  auto st = s.Finish();
  EXPECT_EQ(st.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("a worker rank in [0, 1), got '3'"), std::string::npos);
}

TEST_F(DataServiceTest, PullWaitsForPushOnAnotherStream) {
  // W = 1 here, so use step 0 (init): a pull of step 0 waits until the root's init arrives.
  RawStream puller(address_, kToken, "0");
  RawStream root(address_, kToken, "0");
  ASSERT_TRUE(puller.Write(RequestBytes(wire::Op::kPull, 7, 0, 0, {}, 5)));
  ASSERT_TRUE(root.Write(RequestBytes(wire::Op::kInit, 7, 0, 0, {4, 3, 2, 1}, 6)));
  Answer a;
  ASSERT_TRUE(root.Read(&a));
  EXPECT_EQ(a.header.code, 0);
  ASSERT_TRUE(puller.Read(&a));
  EXPECT_EQ(a.header.request_id, 5u);
  EXPECT_EQ(a.values, (std::vector<float>{4, 3, 2, 1}));
}

}  // namespace
}  // namespace trellis
