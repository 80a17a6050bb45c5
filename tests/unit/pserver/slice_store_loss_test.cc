// A worker lost for good (docs/elastic.md#losing-a-worker): the server stops waiting for its
// pushes from the slice's first step it did not push, so the others, blocked in that step's
// pulls, go on; the mean divides by those who pushed.
#include <gtest/gtest.h>

#include "pserver/slice_store.h"
#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using store_testing::SliceStoreTest;

// Update mode, SGD with learning rate 1, 3 workers. Step 1: workers 0 and 2 pushed and wait;
// worker 1 never will. Its loss completes step 1 with their mean; step 2 needs them alone; a
// push from the lost worker is refused; the world the others announce then changes nothing, and
// a later world naming slot 1 brings it back.
TEST_F(SliceStoreTest, ALostWorkerIsNotWaitedForFromTheFirstStepItDidNotPush) {
  OptimizerSpec sgd;
  sgd.learningRate = 1.0;
  Make(3, ServerMode::kUpdate, sgd, /*slots=*/3);
  Got init;
  Send(0, wire::Op::kInit, 0, {0, 0, 0, 0}, &init);
  ASSERT_TRUE(init.status.ok()) << init.status.ToString();
  Got a1, c1;
  Send(0, wire::Op::kPushPull, 1, {2, 2, 2, 2}, &a1);
  Send(2, wire::Op::kPushPull, 1, {4, 4, 4, 4}, &c1);
  EXPECT_FALSE(a1.called || c1.called) << "worker 1 has not pushed";
  ASSERT_TRUE(store_->LoseWorker(1, 1).ok());
  ASSERT_TRUE(a1.called && c1.called) << "the loss completes the step it held up";
  ASSERT_TRUE(c1.status.ok()) << c1.status.ToString();
  EXPECT_EQ(c1.values, (std::vector<float>{-3, -3, -3, -3})) << "mean of the two pushes";
  EXPECT_EQ(a1.values, c1.values);
  EXPECT_TRUE(store_->LoseWorker(1, 1).ok()) << "a repeat (every ping names it)";

  Got a2, c2, b2;
  Send(0, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &a2);
  EXPECT_FALSE(a2.called);
  Send(1, wire::Op::kPush, 2, {100, 100, 100, 100}, &b2);
  ASSERT_TRUE(b2.called);
  EXPECT_EQ(b2.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(b2.status.message().find("worker 1 pushed step 2, but it was lost for good from step 1"),
            std::string::npos)
      << b2.status.message();
  Send(2, wire::Op::kPushPull, 2, {3, 3, 3, 3}, &c2);
  ASSERT_TRUE(a2.called && c2.called);
  EXPECT_EQ(c2.values, (std::vector<float>{-5, -5, -5, -5}));  // -3 - mean(1, 3)

  for (int32_t w : {0, 2}) {  // the others switch to the world without it
    Got world;
    SendWorld(w, 1, {0, 2}, &world);
    ASSERT_TRUE(world.status.ok()) << world.status.ToString();
  }
  Got a3, c3;
  Send(0, wire::Op::kPushPull, 3, {2, 2, 2, 2}, &a3);
  Send(2, wire::Op::kPushPull, 3, {2, 2, 2, 2}, &c3);
  ASSERT_TRUE(c3.called);
  EXPECT_EQ(c3.values, (std::vector<float>{-7, -7, -7, -7}));

  // A replacement grows the job back into slot 1: world 2 names it, and step 4 waits for it.
  for (int32_t w : {0, 1, 2}) {
    Got world;
    SendWorld(w, 2, {0, 1, 2}, &world);
    ASSERT_TRUE(world.status.ok()) << world.status.ToString();
  }
  Got a4, b4, c4;
  Send(0, wire::Op::kPushPull, 4, {3, 3, 3, 3}, &a4);
  Send(2, wire::Op::kPushPull, 4, {3, 3, 3, 3}, &c4);
  EXPECT_FALSE(a4.called || c4.called) << "worker 1 is back: its push is awaited";
  Send(1, wire::Op::kPushPull, 4, {3, 3, 3, 3}, &b4);
  ASSERT_TRUE(b4.called && b4.status.ok()) << b4.status.ToString();
  EXPECT_EQ(b4.values, (std::vector<float>{-10, -10, -10, -10}));
  EXPECT_TRUE(store_->LoseWorker(1, 1).ok());
  Got a5, c5;
  Send(0, wire::Op::kPush, 5, {1, 1, 1, 1}, &a5);
  Send(2, wire::Op::kPush, 5, {1, 1, 1, 1}, &c5);
  EXPECT_EQ(store_->CompleteStep(7, 0), 4) << "an old loss (world 1) does not drop the worker world 2 brought back";
}

// Aggregate mode: a push the lost worker made of the step in progress counts (the step waits for
// the others, then sums all three); from the next step on the sum is the others'.
TEST_F(SliceStoreTest, ALostWorkersPushOfTheStepInProgressStillCounts) {
  Make(3, ServerMode::kAggregate, {}, /*slots=*/3);
  Got b1, a1, c1;
  Send(1, wire::Op::kPush, 1, {100, 100, 100, 100}, &b1);
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &a1);
  ASSERT_TRUE(store_->LoseWorker(1, 1).ok());
  EXPECT_FALSE(a1.called) << "worker 2 has not pushed step 1";
  Send(2, wire::Op::kPushPull, 1, {2, 2, 2, 2}, &c1);
  ASSERT_TRUE(a1.called && c1.called);
  EXPECT_EQ(c1.values, (std::vector<float>{103, 103, 103, 103}));
  Got a2, c2;
  Send(0, wire::Op::kPushPull, 2, {1, 1, 1, 1}, &a2);
  Send(2, wire::Op::kPushPull, 2, {2, 2, 2, 2}, &c2);
  ASSERT_TRUE(a2.called && c2.called);
  EXPECT_EQ(c2.values, (std::vector<float>{3, 3, 3, 3}));
}

TEST_F(SliceStoreTest, ALostWorkerOutsideTheJobsSlotsIsRefused) {
  Make(2, ServerMode::kAggregate, {}, /*slots=*/2);
  EXPECT_EQ(store_->LoseWorker(2, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->LoseWorker(-1, 1).code(), StatusCode::kInvalidArgument);
  Got a1;
  Send(0, wire::Op::kPushPull, 1, {1, 1, 1, 1}, &a1);
  EXPECT_FALSE(a1.called) << "nothing changed: worker 1 is still awaited";
  Got b1;
  Send(1, wire::Op::kPushPull, 1, {2, 2, 2, 2}, &b1);
  ASSERT_TRUE(a1.called && b1.called);
  EXPECT_EQ(b1.values, (std::vector<float>{3, 3, 3, 3}));
}

}  // namespace
}  // namespace trellis
