// Barriers on their own (no SchedulerState, no lock): generations, catching up, a restarted
// scheduler's fast-forward, deadlines.
#include "scheduler/barriers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class BarriersTest : public ::testing::Test {
 protected:
  BarriersTest() : members_(Config(), &clock_) {
    for (int i = 0; i < 2; ++i) {
      v1::RegisterRequest r;
      r.set_role(v1::ROLE_WORKER);
      r.set_pod_name("w-" + std::to_string(i));
      EXPECT_TRUE(members_.Register(r).ok());
    }
  }
  static const SchedulerConfig& Config() {
    static const SchedulerConfig c = [] {
      SchedulerConfig c;
      c.num_servers = 1;
      c.num_workers = 2;
      return c;
    }();
    return c;
  }
  // Arrives and runs the replies; the answer lands in *got.
  void Arrive(int32_t rank, int64_t generation, std::optional<StatusOr<v1::BarrierResponse>>* got,
              bool restarted = false) {
    v1::BarrierRequest req;
    req.set_name("step");
    req.set_role(v1::ROLE_WORKER);
    req.set_rank(rank);
    req.set_generation(generation);
    Deferred deferred;
    barriers_.Arrive(req, clock_.Now() + 5s, [got](StatusOr<v1::BarrierResponse> r) { got->emplace(std::move(r)); },
                     members_, restarted, clock_.Now(), &deferred);
    RunDeferred(deferred);
  }

  ManualClock clock_;
  Membership members_;
  Barriers barriers_;
};

TEST_F(BarriersTest, ReleasesAGenerationOnceEveryWorkerArrived) {
  std::optional<StatusOr<v1::BarrierResponse>> a, b, late;
  Arrive(0, 0, &a);
  EXPECT_FALSE(a.has_value());
  EXPECT_EQ(barriers_.waiters(), 1u);
  clock_.Advance(2s);
  Arrive(1, 0, &b);
  ASSERT_TRUE(a.has_value() && a->ok());
  ASSERT_TRUE(b.has_value() && b->ok());
  EXPECT_DOUBLE_EQ((*a)->waited_seconds(), 2.0);
  Arrive(0, 0, &late);  // already released: a restarted process catching up
  ASSERT_TRUE(late.has_value() && late->ok());
  SchedulerStats stats;
  barriers_.AddTo(&stats);
  EXPECT_EQ(stats.barrier_releases, 1);
}

TEST_F(BarriersTest, AheadOfTheNextGenerationOnlyAfterARestart) {
  std::optional<StatusOr<v1::BarrierResponse>> ahead, waiting;
  Arrive(0, 3, &ahead);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(ahead->status().code(), StatusCode::kFailedPrecondition);
  ahead.reset();
  Arrive(1, 0, &waiting);
  Arrive(0, 3, &ahead, /*restarted=*/true);
  ASSERT_TRUE(waiting.has_value() && waiting->ok());  // released by the proof of generation 3
  EXPECT_FALSE(ahead.has_value());                      // waits at 3
}

TEST_F(BarriersTest, DeadlinePassedNamesWhoIsMissing) {
  std::optional<StatusOr<v1::BarrierResponse>> a;
  Arrive(1, 0, &a);
  EXPECT_EQ(barriers_.NextDeadline(), clock_.Now() + 5s);
  clock_.Advance(6s);
  Deferred deferred;
  barriers_.Sweep(clock_.Now(), members_, &deferred);
  RunDeferred(deferred);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(a->status().message(), HasSubstr("1 of 2 arrived; waiting for worker 0"));
  EXPECT_EQ(barriers_.waiters(), 0u);
}

}  // namespace
}  // namespace trellis
