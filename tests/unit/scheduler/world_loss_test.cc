// Losing a worker for good in an elastic job (docs/elastic.md#losing-a-worker;
// scheduler/world_plan.h): the job goes on without it while spec.elastic.minWorkers remain, in
// a resize announced at once that the others decide; below that the job fails saying why.
#include <gtest/gtest.h>

#include "scheduler/scheduler_state.h"
#include "scheduler/world_plan.h"
#include "tests/unit/scheduler/elastic_testing.h"

namespace trellis {
namespace {

using elastic_testing::Bounds;
using elastic_testing::Members;

TEST(WorldLossTest, AMemberLostIsLeftOutOfAResizeAnnouncedAtOnceThatTheOthersDecide) {
  WorldPlan plan(3, 3, Bounds(2, 3));
  auto lost = plan.Lose(1, "worker 1 (pod job-worker-1) failed: exit code 137", 1000);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_TRUE(*lost);
  EXPECT_EQ(plan.pending_epoch(), 1);
  EXPECT_EQ(plan.announced_epoch(), 1) << "at once: the others may be blocked waiting for its pushes";
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 2}));
  ASSERT_EQ(plan.lost().size(), 1u);
  EXPECT_EQ(plan.lost()[0].slot(), 1);
  EXPECT_EQ(plan.lost()[0].epoch(), 1);
  EXPECT_NE(plan.lost()[0].why().find("exit code 137"), std::string::npos);
  EXPECT_TRUE(plan.Departed(1));
  auto again = plan.Lose(1, "again", 1000);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again) << "lost already";

  v1::WorldInfo w;
  EXPECT_EQ(plan.Reach(1, 1, 9, 0, &w).status().code(), StatusCode::kInvalidArgument) << "a lost worker's report";
  ASSERT_FALSE(*plan.Reach(0, 1, 9, 0, &w));
  ASSERT_TRUE(*plan.Reach(2, 1, 10, 2000, &w)) << "decided without the lost worker's report";
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(w.from_step(), 12);
  ASSERT_FALSE(plan.resizes().empty());
  EXPECT_EQ(plan.resizes().back().from_workers(), 3);
  EXPECT_EQ(plan.resizes().back().to_workers(), 2);
  EXPECT_NE(plan.resizes().back().reason().find("lost worker 1"), std::string::npos) << plan.resizes().back().reason();
  EXPECT_EQ(plan.lost().size(), 1u) << "the servers (a restarted one too) still need it";

  // A replacement grows the job back into the lost slot; the loss is over then.
  ASSERT_TRUE(plan.Resize(3, "a replacement", 3000).ok());
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1, 2}));
  ASSERT_FALSE(*plan.Reach(1, 2, -1, 3000, &w));
  ASSERT_FALSE(*plan.Reach(0, 2, 20, 3000, &w));
  ASSERT_TRUE(*plan.Reach(2, 2, 20, 3000, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(plan.lost().empty());
  EXPECT_FALSE(plan.Departed(1));
}

// A late replacement (a pod made again after its rank was lost, a restart slower than
// registrationTimeoutSeconds): its program asks to join the next world, and the world grows back
// to take it in, as a grow asked for would.
TEST(WorldLossTest, ALostWorkerThatComesBackGrowsTheWorldBack) {
  WorldPlan plan(3, 4, Bounds(2, 4));
  ASSERT_TRUE(*plan.Lose(1, "worker 1 (pod job-worker-1) was silent", 1000));
  EXPECT_FALSE(plan.GrowBack(1, 1, 1000)) << "the loss's resize is under way";
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(0, 1, 9, 0, &w));
  ASSERT_TRUE(*plan.Reach(2, 1, 9, 0, &w));
  EXPECT_FALSE(plan.GrowBack(1, 1, 2000)) << "not the next world";
  EXPECT_FALSE(plan.GrowBack(0, 2, 2000)) << "a member";
  EXPECT_FALSE(plan.GrowBack(3, 2, 2000)) << "never lost";
  ASSERT_TRUE(plan.GrowBack(1, 2, 2000));
  EXPECT_FALSE(plan.GrowBack(1, 2, 2000)) << "under way";
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(plan.Joining(1));
  EXPECT_EQ(plan.announced_epoch(), 0) << "announced once the joiner asked";
  ASSERT_FALSE(*plan.Reach(1, 2, -1, 2000, &w));
  EXPECT_EQ(plan.announced_epoch(), 2);
  ASSERT_FALSE(*plan.Reach(0, 2, 20, 2100, &w));
  ASSERT_TRUE(*plan.Reach(2, 2, 20, 2100, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(plan.lost().empty());
  EXPECT_EQ(plan.resizes().back().from_workers(), 2);
  EXPECT_EQ(plan.resizes().back().to_workers(), 3);
  EXPECT_EQ(plan.resizes().back().reason(), "worker 1 came back after it was lost");

  // A slot resized away (not lost) does not come back by itself; nor beyond maxWorkers.
  WorldPlan shrunk(3, 3, Bounds(2, 3));
  ASSERT_TRUE(shrunk.Resize(2, "shrink", 0).ok());
  ASSERT_FALSE(*shrunk.Reach(0, 1, 5, 0, &w));
  ASSERT_FALSE(*shrunk.Reach(1, 1, 5, 0, &w));
  ASSERT_TRUE(*shrunk.Reach(2, 1, 5, 0, &w));
  EXPECT_FALSE(shrunk.GrowBack(2, 2, 0));
  WorldPlan full(2, 3, Bounds(1, 2));
  ASSERT_TRUE(*full.Lose(1, "lost", 0));
  ASSERT_TRUE(*full.Reach(0, 1, 5, 0, &w));
  ASSERT_TRUE(full.Resize(2, "grown into slot 1", 0).ok());
  ASSERT_FALSE(*full.Reach(1, 2, -1, 0, &w));
  ASSERT_TRUE(*full.Reach(0, 2, 8, 0, &w));
  EXPECT_FALSE(full.GrowBack(1, 3, 0)) << "back already";
}

TEST(WorldLossTest, BelowMinWorkersTheLossIsRefusedNamingWhy) {
  WorldPlan plan(2, 3, Bounds(2, 3));
  auto lost = plan.Lose(0, "worker 0 (pod job-worker-0) failed: exit code 1", 0);
  EXPECT_EQ(lost.status().code(), StatusCode::kFailedPrecondition);
  const std::string m = lost.status().message();
  EXPECT_NE(m.find("worker 0 (pod job-worker-0) failed: exit code 1"), std::string::npos) << m;
  EXPECT_NE(m.find("1 workers would remain, fewer than spec.elastic.minWorkers (2)"), std::string::npos) << m;
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_TRUE(plan.lost().empty());
  auto outside = plan.Lose(2, "never in the world", 0);
  ASSERT_TRUE(outside.ok());
  EXPECT_FALSE(*outside) << "a slot outside the world: nothing to do";
}

// A loss while a shrink is under way joins it: the lost worker leaves the members (minWorkers
// kept with the lowest of those still here), and when the others had all reported it is decided
// at once.
TEST(WorldLossTest, ALossDuringAResizeJoinsItAndIsDecidedWhenTheOthersHadReported) {
  WorldPlan plan(3, 3, Bounds(2, 3));
  ASSERT_TRUE(plan.Resize(2, "shrink", 0).ok());
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1}));
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(0, 1, 10, 0, &w));
  ASSERT_FALSE(*plan.Reach(2, 1, 11, 0, &w));
  EXPECT_FALSE(plan.DecideIfReported(0, &w)) << "worker 1 did not report";
  ASSERT_TRUE(*plan.Lose(1, "worker 1 lost", 0));
  EXPECT_EQ(plan.pending_epoch(), 1) << "the same resize: the reports made stay valid";
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 2}));
  ASSERT_TRUE(plan.DecideIfReported(0, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(w.from_step(), 13);
}

// A grow not announced yet (a joiner still to start) when a member is lost: it is announced at
// once with the joiners that asked; one asking later stays out.
TEST(WorldLossTest, AGrowNotAnnouncedYetIsAnnouncedWithTheJoinersThatAsked) {
  WorldPlan plan(2, 4, Bounds(1, 4));
  ASSERT_TRUE(plan.Resize(4, "grow", 0).ok());
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(2, 1, -1, 0, &w));
  EXPECT_EQ(plan.announced_epoch(), 0);
  ASSERT_TRUE(*plan.Lose(0, "worker 0 lost", 0));
  EXPECT_EQ(plan.announced_epoch(), 1);
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{1, 2}));
  EXPECT_FALSE(plan.Reach(3, 1, -1, 0, &w).ok()) << "worker 3 asked too late: it stays out";
  ASSERT_TRUE(*plan.Reach(1, 1, 30, 0, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(w.from_step(), 32);
}

// The scheduler: a worker of 3 exits failing under restartPolicy Never (elastic 2..3). The job
// is not failed; the pings name the loss (the servers) and announce the resize (the workers),
// the view lists it (trellis-launch, the operator), and the other two decide the world of 2.
class WorldLossStateTest : public ::testing::Test {
 protected:
  void Start(int32_t workers, ElasticBounds bounds) {
    SchedulerConfig c;
    c.num_servers = 1;
    c.num_workers = workers;
    c.elastic = bounds;
    state_ = std::make_unique<SchedulerState>(c, &clock_);
    elastic_testing::RegisterPods(state_.get(), workers);
  }
  void Exit(int32_t rank, int32_t code) {
    v1::ReportExitRequest exit;
    exit.set_role(v1::ROLE_WORKER);
    exit.set_rank(rank);
    exit.set_exit_code(code);
    ASSERT_TRUE(state_->ReportExit(exit).ok());
  }
  StatusOr<v1::ReachStepResponse> Reach(int32_t rank, int64_t step, int64_t epoch = 1) {
    v1::ReachStepRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_epoch(epoch);
    r.set_step(step);
    std::optional<StatusOr<v1::ReachStepResponse>> got;
    state_->ReachStep(r, Clock::TimePoint::max(), [&](auto a) { got = a; });
    return got.value_or(InternalError("not answered"));
  }
  SteadyClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

TEST_F(WorldLossStateTest, AWorkerFailingUnderNeverIsLostAndTheOthersGoOn) {
  Start(3, Bounds(2, 3));
  Exit(1, 137);
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_FALSE(view.failed()) << view.failure_message();
  ASSERT_EQ(view.lost_workers_size(), 1);
  EXPECT_EQ(view.lost_workers(0).slot(), 1);
  EXPECT_NE(view.lost_workers(0).why().find("worker 1 (pod job-worker-1) failed: exit code 137"), std::string::npos)
      << view.lost_workers(0).why();
  const v1::PingResponse ping = state_->Ping();
  EXPECT_EQ(ping.resize_epoch(), 1);
  ASSERT_EQ(ping.lost_workers_size(), 1);
  EXPECT_EQ(ping.lost_workers(0).epoch(), 1);
  EXPECT_TRUE(state_->Training());
  EXPECT_EQ(state_->stats().workers_lost, 1);

  auto a = Reach(0, 20);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_FALSE(a->decided());
  auto b = Reach(2, 20);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(b->decided());
  EXPECT_EQ(Members(b->world()), (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(state_->stats().world_workers, 2);

  // The two finish: the job's end (the lost worker is not awaited).
  Exit(0, 0);
  Exit(2, 0);
  EXPECT_FALSE(state_->GetCluster().failed());
  EXPECT_FALSE(state_->Training());
}

// The lost worker's program comes back (a late replacement) and asks to join: the scheduler
// grows the world back to 3 and the members decide it as any grow.
TEST_F(WorldLossStateTest, ALostWorkerWhoseProgramComesBackIsGrownBackIn) {
  Start(3, Bounds(2, 3));
  Exit(1, 137);
  ASSERT_TRUE(Reach(0, 20).ok());
  ASSERT_TRUE(Reach(2, 20)->decided());

  v1::ReachStepRequest join;
  join.set_rank(1);
  join.set_epoch(2);
  join.set_step(-1);
  join.set_wait(true);
  std::optional<StatusOr<v1::ReachStepResponse>> joined;
  state_->ReachStep(join, Clock::TimePoint::max(), [&](auto a) { joined = a; });
  EXPECT_FALSE(joined.has_value()) << "it waits for the members' decision";
  EXPECT_EQ(state_->Ping().resize_epoch(), 2);
  ASSERT_FALSE(Reach(0, 30, 2)->decided());
  ASSERT_TRUE(Reach(2, 30, 2)->decided());
  ASSERT_TRUE(joined.has_value());
  ASSERT_TRUE(joined->ok()) << joined->status().ToString();
  EXPECT_EQ(Members((*joined)->world()), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(state_->GetCluster().lost_workers_size(), 0);
  EXPECT_EQ(state_->stats().world_workers, 3);

  // Once a worker finished, the job is ending: a lost one coming back stays out.
  Start(3, Bounds(2, 3));
  Exit(1, 137);
  ASSERT_TRUE(Reach(0, 20).ok());
  ASSERT_TRUE(Reach(2, 20)->decided());
  Exit(0, 0);
  EXPECT_EQ(Reach(1, -1, 2).status().code(), StatusCode::kFailedPrecondition);
}

// A silent worker (its node gone) is lost having reported no exit; the replacement pod that
// registers later under its name is not taken for a worker that finished: it gets its rank, to
// run and ask to join.
TEST(WorldLossSilentTest, ASilentWorkersReplacementRegistersToRunNotAsFinished) {
  using namespace std::chrono_literals;
  SchedulerConfig c;
  c.num_servers = 1;
  c.num_workers = 3;
  c.elastic = Bounds(2, 3);
  c.heartbeat_timeout = 3s;
  c.replacement_timeout = 5s;
  ManualClock clock;
  SchedulerState state(c, &clock);
  elastic_testing::RegisterPods(&state, 3);
  auto beat = [&](v1::Role role, int32_t rank) {
    v1::HeartbeatRequest h;
    h.set_role(role);
    h.set_rank(rank);
    h.set_incarnation(1);
    ASSERT_TRUE(state.Heartbeat(h).ok());
  };
  for (int i = 0; i < 5; ++i) {  // worker 1 silent, the others beating
    clock.Advance(2s);
    beat(v1::ROLE_WORKER, 0);
    beat(v1::ROLE_WORKER, 2);
    beat(v1::ROLE_SERVER, 0);
    state.Sweep();
  }
  const v1::ClusterView view = state.GetCluster();
  ASSERT_FALSE(view.failed()) << view.failure_message();
  ASSERT_EQ(view.lost_workers_size(), 1);
  EXPECT_TRUE(view.lost_workers(0).silent());

  v1::RegisterRequest again;
  again.set_role(v1::ROLE_WORKER);
  again.set_pod_name("job-worker-1");
  auto r = state.Register(again);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->finished()) << "a lost worker did not finish";
  EXPECT_EQ(r->rank(), 1);
  EXPECT_EQ(r->incarnation(), 2);
}

TEST_F(WorldLossStateTest, BelowMinWorkersTheJobFailsNamingMinWorkers) {
  Start(2, Bounds(2, 3));
  Exit(1, 1);
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_TRUE(view.failed());
  EXPECT_NE(view.failure_message().find("worker 1 (pod job-worker-1) failed: exit code 1"), std::string::npos)
      << view.failure_message();
  EXPECT_NE(view.failure_message().find("fewer than spec.elastic.minWorkers (2)"), std::string::npos)
      << view.failure_message();
  EXPECT_EQ(view.lost_workers_size(), 0);
  EXPECT_EQ(state_->stats().workers_lost, 0);
}

TEST_F(WorldLossStateTest, WithoutSpecElasticAFailingWorkerFailsTheJobAsBefore) {
  Start(3, ElasticBounds{});
  Exit(1, 137);
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_TRUE(view.failed());
  EXPECT_EQ(view.failure_message(), "worker 1 (pod job-worker-1) failed: exit code 137 (killed by SIGKILL)");
  EXPECT_EQ(view.lost_workers_size(), 0);
}

}  // namespace
}  // namespace trellis
