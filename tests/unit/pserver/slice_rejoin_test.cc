// SliceStore crash recovery: the stash side buffer (kStash / kFetch) and a rejoined worker's
// pushes of steps already counted (kRejoin); docs/checkpoints.md#crash-recovery-workers.
#include <gtest/gtest.h>

#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using testing::RequestBytes;
using testing::Split;

// Two workers, key 7 of 4 elements (the shared SliceStore fixture).
class SliceStoreRejoinTest : public store_testing::SliceStoreTest {
 protected:
  void SetUp() override { Make(2); }
  // A request whose answer is known at once.
  Got Do(int32_t worker, wire::Op op, int64_t step, std::vector<float> v = {}) {
    Got g;
    Send(worker, op, step, std::move(v), &g);
    EXPECT_TRUE(g.called) << wire::OpName(op) << " step " << step << " not answered at once";
    return g;
  }
};

TEST_F(SliceStoreRejoinTest, EachRejoinsStashIsFetchedOnceUnderItsIdAndLeavesTheStepsAlone) {
  ASSERT_TRUE(Do(0, wire::Op::kInit, 0, {1, 2, 3, 4}).status.ok());
  ASSERT_TRUE(Do(0, wire::Op::kStash, 41, {4, 5, 6, 7}).status.ok());
  Got other = Do(1, wire::Op::kFetch, 40);
  EXPECT_EQ(other.status.code(), StatusCode::kNotFound);
  EXPECT_NE(other.status.message().find("nothing stashed for rejoin 40 (the stash holds rejoin 41)"),
            std::string::npos)
      << other.status.ToString();
  Got got = Do(1, wire::Op::kFetch, 41);
  ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  EXPECT_EQ(got.values, (std::vector<float>{4, 5, 6, 7}));
  EXPECT_EQ(Do(1, wire::Op::kFetch, 41).status.code(), StatusCode::kNotFound);  // dropped
  // The step protocol did not see any of it.
  EXPECT_EQ(store_->CompleteStep(7, 0), 0);
  EXPECT_EQ(Do(1, wire::Op::kPull, 0).values, (std::vector<float>{1, 2, 3, 4}));
  // Two rejoins at once (a grow brings two joiners): each fetches its own, in any order.
  ASSERT_TRUE(Do(0, wire::Op::kStash, 1, {1, 1, 1, 1}).status.ok());
  ASSERT_TRUE(Do(0, wire::Op::kStash, 2, {2, 2, 2, 2}).status.ok());
  EXPECT_EQ(Do(1, wire::Op::kFetch, 2).values, (std::vector<float>{2, 2, 2, 2}));
  EXPECT_EQ(Do(1, wire::Op::kFetch, 1).values, (std::vector<float>{1, 1, 1, 1}));
  // The same rejoin stashed again (its donor retried) replaces its own; beyond the job's worker
  // slots (2 here) the oldest goes.
  ASSERT_TRUE(Do(0, wire::Op::kStash, 3, {3, 3, 3, 3}).status.ok());
  ASSERT_TRUE(Do(0, wire::Op::kStash, 3, {4, 4, 4, 4}).status.ok());
  ASSERT_TRUE(Do(0, wire::Op::kStash, 5, {5, 5, 5, 5}).status.ok());
  ASSERT_TRUE(Do(0, wire::Op::kStash, 6, {6, 6, 6, 6}).status.ok());
  Got gone = Do(1, wire::Op::kFetch, 3);
  EXPECT_EQ(gone.status.code(), StatusCode::kNotFound);
  EXPECT_NE(gone.status.message().find("(the stash holds rejoin 5, 6)"), std::string::npos) << gone.status.ToString();
  EXPECT_EQ(Do(1, wire::Op::kFetch, 5).values, (std::vector<float>{5, 5, 5, 5}));
}

TEST_F(SliceStoreRejoinTest, StashOfTheWrongSizeIsInvalidArgument) {
  Got a = Do(0, wire::Op::kStash, 1, {1, 2, 3});
  EXPECT_EQ(a.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status.message().find("stash of 3 elements, the slice has 4"), std::string::npos)
      << a.status.ToString();
}

TEST_F(SliceStoreRejoinTest, MalformedRejoinFramesAreRejectedByTheDecoder) {
  wire::RequestHeader h;
  uint64_t id;
  // A fetch or rejoin carries no payload; a stash is whole floats.
  auto fetch = RequestBytes(wire::Op::kFetch, 7, 0, 1, {1.0f});
  EXPECT_EQ(wire::DecodeRequest(Split(fetch, 7), &h, &id).code(), StatusCode::kInvalidArgument);
  auto rejoin = RequestBytes(wire::Op::kRejoin, 0, 0, 0, {1.0f});
  EXPECT_EQ(wire::DecodeRequest(Split(rejoin, 7), &h, &id).code(), StatusCode::kInvalidArgument);
  auto stash = RequestBytes(wire::Op::kStash, 7, 0, 1, {1.0f});
  stash.pop_back();
  wire::RequestHeader sh;
  sh.op = wire::Op::kStash;
  sh.key = 7;
  sh.payload_bytes = 3;
  wire::EncodeRequestHeader(sh, stash.data());
  Status st = wire::DecodeRequest(Split(stash, 7), &h, &id);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  // Not in a bulk: a rejoin transfer goes alone.
  auto bulk = testing::BulkBytes({RequestBytes(wire::Op::kFetch, 7, 0, 1, {})});
  std::vector<wire::BulkEntry> entries;
  st = wire::ParseBulk(Split(bulk, 7), wire::kRequestHeaderBytes,
                       bulk.size() - wire::kRequestHeaderBytes, &entries);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("op fetch cannot travel in a bulk"), std::string::npos)
      << st.ToString();
  EXPECT_STREQ(wire::OpName(wire::Op::kRejoin), "rejoin");
  EXPECT_STREQ(wire::OpName(wire::Op::kStash), "stash");
}

TEST_F(SliceStoreRejoinTest, WithoutRejoinAReplayedPushIsStillAnError) {
  ASSERT_TRUE(Do(0, wire::Op::kPush, 1, {1, 1, 1, 1}).status.ok());
  ASSERT_TRUE(Do(1, wire::Op::kPush, 1, {2, 2, 2, 2}).status.ok());
  EXPECT_EQ(Do(1, wire::Op::kPush, 1, {2, 2, 2, 2}).status.code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(Do(1, wire::Op::kPush, 2, {2, 2, 2, 2}).status.ok());
  EXPECT_EQ(Do(1, wire::Op::kPush, 2, {2, 2, 2, 2}).status.code(), StatusCode::kAlreadyExists);
}

// The dead incarnation of worker 1 pushed steps 1 and 2 (step 2 is not complete); the rejoiner
// resumes at step 1 (the donor's commit was step 0) and pushes 1, 2, 3.
TEST_F(SliceStoreRejoinTest, RejoinedWorkerPushesOfCountedStepsAreNoOps) {
  ASSERT_TRUE(Do(0, wire::Op::kPush, 1, {1, 1, 1, 1}).status.ok());
  ASSERT_TRUE(Do(1, wire::Op::kPush, 1, {10, 10, 10, 10}).status.ok());
  ASSERT_TRUE(Do(1, wire::Op::kPush, 2, {20, 20, 20, 20}).status.ok());  // then worker 1 dies

  ASSERT_TRUE(Do(1, wire::Op::kRejoin, 0).status.ok());
  // Step 1 is complete: the push is answered without adding, the pull from the kept result.
  Got s1 = Do(1, wire::Op::kPushPull, 1, {99, 99, 99, 99});
  ASSERT_TRUE(s1.status.ok()) << s1.status.ToString();
  EXPECT_EQ(s1.values, (std::vector<float>{11, 11, 11, 11}));
  // Step 2 holds the dead incarnation's push: a no-op that waits for worker 0 like any pull.
  Got s2;
  Send(1, wire::Op::kPushPull, 2, {99, 99, 99, 99}, &s2);
  EXPECT_FALSE(s2.called);
  ASSERT_TRUE(Do(0, wire::Op::kPush, 2, {2, 2, 2, 2}).status.ok());
  ASSERT_TRUE(s2.called);
  ASSERT_TRUE(s2.status.ok()) << s2.status.ToString();
  EXPECT_EQ(s2.values, (std::vector<float>{22, 22, 22, 22}));  // the dead push counted once
  // Step 3 was never pushed: it counts, and from then on worker 1 is an ordinary worker.
  ASSERT_TRUE(Do(1, wire::Op::kPush, 3, {30, 30, 30, 30}).status.ok());
  EXPECT_EQ(Do(1, wire::Op::kPush, 3, {30, 30, 30, 30}).status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Do(1, wire::Op::kPush, 2, {30, 30, 30, 30}).status.code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(Do(0, wire::Op::kPush, 3, {3, 3, 3, 3}).status.ok());
  EXPECT_EQ(Do(0, wire::Op::kPull, 3).values, (std::vector<float>{33, 33, 33, 33}));
  // Worker 0 never rejoined: its replays stay errors.
  EXPECT_EQ(Do(0, wire::Op::kPush, 3, {3, 3, 3, 3}).status.code(), StatusCode::kOutOfRange);
}

TEST(SliceStoreRejoinNoMapTest, RejoinBeforeAShardMapIsFailedPrecondition) {
  StoreConfig c;
  c.num_workers = 2;
  SliceStore store(c);
  auto bytes = RequestBytes(wire::Op::kRejoin, 0, 0, 0, {});
  auto chunks = Split(bytes, 48);
  wire::RequestHeader h;
  uint64_t id;
  ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
  Status got;
  store.Handle(1, h, chunks, [&](const Status& s, Answer) { got = s; });
  EXPECT_EQ(got.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(got.message().find("rejoin of worker 1: no shard map installed"), std::string::npos);
}

}  // namespace
}  // namespace trellis
