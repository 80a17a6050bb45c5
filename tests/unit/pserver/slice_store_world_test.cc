// Elastic jobs on the server: each step counted against its world (pserver/world_schedule.h),
// announced by kWorld before the step's first push.
#include <gtest/gtest.h>

#include "pserver/slice_store.h"
#include "scheduler/shard_map.h"
#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using store_testing::SliceStoreTest;

OptimizerSpec Sgd(double lr) {
  OptimizerSpec sgd;
  sgd.learningRate = lr;
  return sgd;
}

// Update mode, 4 ranks, 2 workers at the start. World 1 = {0, 2, 3} after step 1: step 2 waits
// for all three, its mean divides by 3, and worker 1 (left) may still read its last step but not
// push. Then world 2 = {2} alone: one push completes step 3, the mean is that push.
TEST_F(SliceStoreTest, AStepCompletesWithItsWorldAndItsMeanDividesByItsMembers) {
  Make(2, ServerMode::kUpdate, Sgd(1.0), /*slots=*/4);
  Got init;
  Send(0, wire::Op::kInit, 0, {0, 0, 0, 0}, &init);
  ASSERT_TRUE(init.status.ok()) << init.status.ToString();
  Got a1, b1;
  Send(0, wire::Op::kPushPull, 1, {2, 2, 2, 2}, &a1);
  Send(1, wire::Op::kPushPull, 1, {4, 4, 4, 4}, &b1);
  ASSERT_TRUE(b1.status.ok()) << b1.status.ToString();
  EXPECT_EQ(b1.values, (std::vector<float>{-3, -3, -3, -3}));  // mean 3, w -= 1 * 3

  for (int32_t w : {0, 2, 3}) {
    Got world;
    SendWorld(w, 1, {0, 2, 3}, &world);
    ASSERT_TRUE(world.status.ok()) << "worker " << w << ": " << world.status.ToString();
  }
  EXPECT_EQ(store_->worlds().Current()->Describe(), "world 1 {0, 2, 3}");

  Got left;
  Send(1, wire::Op::kPushPull, 2, {100, 100, 100, 100}, &left);
  ASSERT_TRUE(left.called);
  EXPECT_EQ(left.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(left.status.message().find("worker 1 pushed step 2, but it is not in world 1 "
                                       "{0, 2, 3}"),
            std::string::npos)
      << left.status.message();
  Got last;
  Send(1, wire::Op::kPull, 1, {}, &last);  // the leaving worker's last step is still there
  ASSERT_TRUE(last.status.ok()) << last.status.ToString();
  EXPECT_EQ(last.values, b1.values);

  Got a2, c2, d2;
  Send(0, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &a2);
  Send(2, wire::Op::kPushPull, 2, {2, 2, 2, 2}, &c2);
  EXPECT_FALSE(a2.called || c2.called) << "two of the world's three pushed";
  Send(3, wire::Op::kPushPull, 2, {6, 6, 6, 6}, &d2);
  ASSERT_TRUE(a2.called && c2.called && d2.called);
  ASSERT_TRUE(d2.status.ok()) << d2.status.ToString();
  EXPECT_EQ(d2.values, (std::vector<float>{-6, -6, -6, -6}));  // mean (1+2+6)/3 = 3
  EXPECT_EQ(a2.values, d2.values);

  Got alone;
  SendWorld(2, 2, {2}, &alone);
  ASSERT_TRUE(alone.status.ok()) << alone.status.ToString();
  Got c3;
  Send(2, wire::Op::kPushPull, 3, {5, 5, 5, 5}, &c3);
  ASSERT_TRUE(c3.called);
  ASSERT_TRUE(c3.status.ok()) << c3.status.ToString();
  EXPECT_EQ(c3.values, (std::vector<float>{-11, -11, -11, -11}));
  EXPECT_EQ(store_->CompleteStep(7, 0), 3);
}

// Aggregate mode answers the sum of the slice's world; a worker that joins counts from the step
// after the announcement, and a grown world waits for its new member.
TEST_F(SliceStoreTest, AggregateSumsTheWorldOfEachStep) {
  Make(1, ServerMode::kAggregate, {}, /*slots=*/2);
  Got a1;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a1);
  ASSERT_TRUE(a1.called);
  EXPECT_EQ(a1.values, (std::vector<float>{1, 2, 3, 4}));
  Got early;
  Send(1, wire::Op::kPush, 2, {9, 9, 9, 9}, &early);  // before anyone announced its world
  EXPECT_EQ(early.status.code(), StatusCode::kFailedPrecondition) << early.status.ToString();
  for (int32_t w : {0, 1}) {
    Got world;
    SendWorld(w, 1, {1, 0}, &world);  // any order names the same world
    ASSERT_TRUE(world.status.ok()) << world.status.ToString();
  }
  Got a2, b2;
  Send(0, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &a2);
  EXPECT_FALSE(a2.called) << "the grown world waits for its new member";
  Send(1, wire::Op::kPushPull, 2, {10, 10, 10, 10}, &b2);
  ASSERT_TRUE(a2.called && b2.called);
  EXPECT_EQ(a2.values, (std::vector<float>{11, 11, 11, 11}));
}

// A key declared after a resize (deferred init) counts its steps in the world of then.
TEST_F(SliceStoreTest, ASliceMadeAfterAResizeCountsInTheNewWorld) {
  Make(2, ServerMode::kAggregate, {}, /*slots=*/2);
  Got world;
  SendWorld(0, 1, {0}, &world);
  ASSERT_TRUE(world.status.ok()) << world.status.ToString();
  v1::KeySpec k7, k8;
  for (auto [k, id] : {std::pair{&k7, 7}, std::pair{&k8, 8}}) {
    k->set_id(id);
    k->set_name(id == 7 ? "w" : "w8");  // key 7 as the fixture installed it
    k->set_num_elements(4);
    k->set_dtype(v1::DTYPE_FLOAT32);
  }
  auto map = BuildShardMap({k7, k8}, 1, "roundRobin", 1 << 20);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  int64_t slices = 0, bytes = 0;
  ASSERT_TRUE(store_->Install(*map, &slices, &bytes).ok());
  EXPECT_EQ(slices, 2);
  Got a;
  Send(0, wire::Op::kPushPull, 1, {1, 2, 3, 4}, &a, /*key=*/8);
  ASSERT_TRUE(a.called) << "the one member's push completes the new key's step";
  EXPECT_EQ(a.values, (std::vector<float>{1, 2, 3, 4}));
}

// A world announced once a slice counted a push of its next step is refused (that push was
// counted against the old world) and changes nothing; the same world repeated after pushes
// started is not a change and is answered OK; a stale or crossed one is refused.
TEST_F(SliceStoreTest, AWorldAnnouncedAfterPushesStartedIsRefused) {
  Make(2, ServerMode::kAggregate, {}, /*slots=*/3);
  Got a1;
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &a1);
  Got late;
  SendWorld(0, 1, {0}, &late);
  EXPECT_EQ(late.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status.message().find("announced too late"), std::string::npos)
      << late.status.message();
  EXPECT_EQ(store_->worlds().Current()->epoch, 0);
  Got b1;
  Send(1, wire::Op::kPushPull, 1, {2, 2, 2, 2}, &b1);
  ASSERT_TRUE(a1.called && b1.called);
  EXPECT_EQ(b1.values, (std::vector<float>{3, 3, 3, 3}));

  Got grow;
  SendWorld(0, 1, {0, 1, 2}, &grow);
  ASSERT_TRUE(grow.status.ok()) << grow.status.ToString();
  Got a2;
  Send(0, wire::Op::kPush, 2, {1, 1, 1, 1}, &a2);
  ASSERT_TRUE(a2.status.ok()) << a2.status.ToString();
  Got again;
  SendWorld(2, 1, {2, 1, 0}, &again);  // a later member announcing the same world
  EXPECT_TRUE(again.status.ok()) << again.status.ToString();
  Got other;
  SendWorld(1, 1, {0, 1}, &other);  // another world of the same epoch: crossed resizes
  EXPECT_EQ(other.status.code(), StatusCode::kFailedPrecondition) << other.status.ToString();
  EXPECT_EQ(store_->worlds().Current()->size, 3);
  Got b2, c2;
  Send(1, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &b2);
  Send(2, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &c2);
  ASSERT_TRUE(b2.called && c2.called);
  Got stale;
  SendWorld(0, 0, {0}, &stale);
  EXPECT_EQ(stale.status.code(), StatusCode::kFailedPrecondition) << stale.status.ToString();
  EXPECT_NE(stale.status.message().find("world 1 {0, 1, 2} is already in force"),
            std::string::npos)
      << stale.status.message();
}

// Hostile or confused announcements get a clear error and leave the world as it was.
TEST_F(SliceStoreTest, BadWorldsAreRefusedAndChangeNothing) {
  Make(2, ServerMode::kAggregate, {}, /*slots=*/4);
  struct Case {
    int32_t sender;
    int64_t epoch;
    std::vector<int32_t> members;
    std::vector<uint8_t> payload;  // set: sent instead of the members
    const char* message;
  };
  const std::vector<uint8_t> ragged = {1, 0, 0, 0, 2};
  const std::vector<int32_t> five = {0, 1, 2, 3, 0};
  const std::vector<Case> cases = {
      {0, 1, {}, ragged, "not a whole number of int32 worker ranks"},
      {0, 1, five, {}, "5 workers named, the job has 4 worker ranks"},
      {0, 1, {0, 9}, {}, "worker 9 is not a slot of this job [0, 4)"},
      {0, 1, {0, -1}, {}, "worker -1 is not a slot of this job [0, 4)"},
      {0, 1, {0, 0}, {}, "worker 0 named twice"},
      {1, 1, {0, 2}, {}, "worker 1 announced a world it is not in"},
      {0, 1, {}, {}, "worker 0 announced a world it is not in"},
      {0, -1, {0}, {}, "a negative world epoch: -1"},
  };
  for (const Case& c : cases) {
    Got got;
    SendWorld(c.sender, c.epoch, c.members, &got, c.payload.empty() ? nullptr : &c.payload);
    ASSERT_TRUE(got.called);
    EXPECT_EQ(got.status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(got.status.message().find(c.message), std::string::npos) << got.status.message();
  }
  EXPECT_EQ(store_->worlds().Current()->Describe(), "world 0 {0, 1}");
  Got a, b;
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &a);
  Send(1, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &b);
  ASSERT_TRUE(a.called && b.called);
  EXPECT_EQ(a.values, (std::vector<float>{2, 2, 2, 2}));
}

}  // namespace
}  // namespace trellis
