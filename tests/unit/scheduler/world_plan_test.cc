// Elastic jobs on the scheduler (scheduler/world_plan.h): a resize asked for, the workers'
// reports of the steps they reached, the decision, and what a job that is not elastic gets.
#include "scheduler/world_plan.h"

#include <gtest/gtest.h>

#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/elastic_testing.h"

namespace trellis {
namespace {

using elastic_testing::Bounds;
using elastic_testing::Members;

TEST(WorldPlanTest, AJobThatIsNotElasticRefusesToResizeSayingHow) {
  WorldPlan plan(2, 2, ElasticBounds{});
  auto r = plan.Resize(1, "test", 0);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("not elastic"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("spec.elastic"), std::string::npos) << r.status().message();
  EXPECT_EQ(plan.pending_epoch(), 0);
}

TEST(WorldPlanTest, ResizesOutsideTheBoundsAreRefused) {
  WorldPlan plan(3, 4, Bounds(2, 4));
  EXPECT_EQ(plan.Resize(1, "", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.Resize(5, "", 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.Resize(1, "", 0).status().message().find("outside spec.elastic [2, 4]"),
            std::string::npos);
  auto same = plan.Resize(3, "", 0);
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ(same->epoch(), 0) << "nothing to do";
  EXPECT_EQ(plan.pending_epoch(), 0);
}

// Growing brings back the lowest slots the world left. The members hear of it only once every
// joiner asked to join; the joiners do not report steps, the members decide as for a shrink.
TEST(WorldPlanTest, AGrowIsAnnouncedOnceTheJoinersAskedAndDecidedByTheMembers) {
  WorldPlan plan(4, 4, Bounds(1, 4));
  v1::WorldInfo w;
  ASSERT_TRUE(plan.Resize(2, "", 0).ok());
  for (int32_t m = 0; m < 3; ++m) ASSERT_FALSE(*plan.Reach(m, 1, 10, 0, &w));
  ASSERT_TRUE(*plan.Reach(3, 1, 10, 0, &w));
  ASSERT_EQ(Members(w), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(plan.Departed(2) && plan.Departed(3));

  auto r = plan.Resize(3, "grow", 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch(), 2);
  EXPECT_EQ(plan.pending_epoch(), 2);
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1, 2})) << "the lowest slot left";
  EXPECT_EQ(plan.announced_epoch(), 0) << "not before the joiner runs";
  EXPECT_EQ(plan.Reach(3, 2, -1, 0, &w).status().code(), StatusCode::kInvalidArgument) << "not a joiner";
  auto d = plan.Reach(2, 2, -1, 1100, &w);  // the joiner asks to join: it waits
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_FALSE(*d);
  EXPECT_EQ(plan.announced_epoch(), 2);
  EXPECT_FALSE(*plan.Reach(0, 2, 30, 1200, &w));
  d = plan.Reach(1, 2, 31, 1300, &w);
  ASSERT_TRUE(d.ok() && *d);
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(w.from_step(), 33);
  EXPECT_FALSE(plan.Departed(2));
  EXPECT_TRUE(plan.Departed(3));
  d = plan.Reach(2, 2, -1, 1400, &w);  // the joiner's wait answered with the decided world
  ASSERT_TRUE(d.ok() && *d);
  EXPECT_EQ(w.from_step(), 33);
  EXPECT_EQ(plan.resizes().back().to_workers(), 3);

  // A joiner that never starts: the grow is given up, naming it.
  ASSERT_TRUE(plan.Resize(4, "", 2000).ok());
  EXPECT_EQ(plan.AbandonUnreported(2000 + WorldPlan::kUnreportedLimitMs - 1, WorldPlan::kUnreportedLimitMs), "");
  const std::string why = plan.AbandonUnreported(2000 + WorldPlan::kUnreportedLimitMs, WorldPlan::kUnreportedLimitMs);
  EXPECT_NE(why.find("worker 3 did not start"), std::string::npos) << why;
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_EQ(plan.size(), 3);
}

// Growing beyond the job's first size (up to maxWorkers): the slots never used start outside the
// world and join like the ones a shrink left (the 2 -> 4 -> 1).
TEST(WorldPlanTest, AJobGrowsBeyondItsFirstSizeIntoSlotsNeverUsed) {
  WorldPlan plan(2, 4, Bounds(1, 4));
  EXPECT_EQ(Members(plan.current()), (std::vector<int32_t>{0, 1}));
  EXPECT_TRUE(plan.Departed(2) && plan.Departed(3)) << "outside the world from the start";
  EXPECT_FALSE(plan.Departed(1));
  auto r = plan.Resize(4, "kubectl scale", 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(plan.Joining(2) && plan.Joining(3));
  EXPECT_FALSE(plan.Joining(1));
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(3, 1, -1, 1100, &w));
  EXPECT_EQ(plan.announced_epoch(), 0) << "worker 2 has not asked yet";
  ASSERT_FALSE(*plan.Reach(2, 1, -1, 1200, &w));
  EXPECT_EQ(plan.announced_epoch(), 1);
  ASSERT_FALSE(*plan.Reach(0, 1, 7, 1300, &w));
  ASSERT_TRUE(*plan.Reach(1, 1, 7, 1300, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(w.from_step(), 9);
  EXPECT_FALSE(plan.Departed(3));
  // ... and down to one: the lowest slot stays.
  ASSERT_TRUE(plan.Resize(1, "", 2000).ok());
  for (int32_t m = 0; m < 3; ++m) ASSERT_FALSE(*plan.Reach(m, 2, 20, 2100, &w));
  ASSERT_TRUE(*plan.Reach(3, 2, 20, 2100, &w));
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0}));
  EXPECT_TRUE(plan.Departed(1) && plan.Departed(2) && plan.Departed(3));
  // A world handed back after a scheduler restart may name any of the slots.
  WorldPlan restarted(2, 4, Bounds(1, 4));
  v1::WorldInfo back;
  back.set_epoch(1);
  back.set_from_step(9);
  for (int32_t m : {0, 1, 2, 3}) back.add_members(m);
  auto adopted = restarted.Adopt(back);
  ASSERT_TRUE(adopted.ok() && *adopted) << adopted.status().ToString();
  EXPECT_FALSE(restarted.Departed(3));
}

// The new world starts after the furthest step any member reported: no member pushed it yet,
// since each waits for the decision at its boundary after its report.
TEST(WorldPlanTest, TheNewWorldStartsAfterTheFurthestStepReported) {
  WorldPlan plan(3, 3, Bounds(1, 3));
  auto r = plan.Resize(2, "kubectl scale", 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch(), 1);
  EXPECT_EQ(plan.pending_epoch(), 1);
  EXPECT_EQ(plan.Resize(1, "", 0).status().code(), StatusCode::kFailedPrecondition)
      << "one resize at a time";

  v1::WorldInfo w;
  auto d = plan.Reach(0, 1, 40, 1100, &w);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  d = plan.Reach(2, 1, 41, 1200, &w);  // the leaving worker reports too
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  d = plan.Reach(0, 1, 41, 1300, &w);  // a member's next report, still undecided
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(*d);
  EXPECT_FALSE(plan.Departed(2));
  d = plan.Reach(1, 1, 40, 1400, &w);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(*d);
  EXPECT_EQ(w.epoch(), 1);
  EXPECT_EQ(w.from_step(), 43);  // 41 reported by worker 0 and worker 2, + 2
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1}));  // the highest slots leave
  EXPECT_TRUE(plan.Departed(2));
  EXPECT_FALSE(plan.Departed(1));
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_EQ(plan.size(), 2);
  ASSERT_EQ(plan.resizes().size(), 1u);
  EXPECT_EQ(plan.resizes()[0].from_workers(), 3);
  EXPECT_EQ(plan.resizes()[0].to_workers(), 2);
  EXPECT_EQ(plan.resizes()[0].from_step(), 43);
  EXPECT_EQ(plan.resizes()[0].reason(), "kubectl scale");
  EXPECT_EQ(plan.resizes()[0].decided_unix_ms() - plan.resizes()[0].asked_unix_ms(), 400);

  // The leaving worker learns the decision at its next boundary, though it is no member now.
  v1::WorldInfo again;
  d = plan.Reach(2, 1, 41, 1500, &again);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(*d);
  EXPECT_EQ(again.SerializeAsString(), w.SerializeAsString());

  // Shrinking again: only the members of world 1 report.
  ASSERT_TRUE(plan.Resize(1, "", 2000).ok());
  EXPECT_EQ(plan.Reach(2, 2, 50, 0, &w).status().code(), StatusCode::kInvalidArgument)
      << "a departed worker is no member";
  ASSERT_TRUE(plan.Reach(1, 2, 50, 0, &w).ok());
  d = plan.Reach(0, 2, 49, 0, &w);
  ASSERT_TRUE(d.ok() && *d);
  EXPECT_EQ(w.from_step(), 52);
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0}));
}

// A program that never reaches a boundary the scheduler hears of (no Checkpointer) cannot be
// resized: the resize is given up, saying why, and the job may be asked again.
TEST(WorldPlanTest, AWorldHandedBackIsAdoptedWhenNewerAndCheckedFirst) {
  WorldPlan plan(3, 3, Bounds(1, 3));
  v1::WorldInfo w;
  w.set_epoch(2);
  w.set_from_step(50);
  w.add_members(0);
  w.add_members(2);
  auto adopted = plan.Adopt(w);
  ASSERT_TRUE(adopted.ok()) << adopted.status().ToString();
  EXPECT_TRUE(*adopted);
  EXPECT_EQ(Members(plan.current()), (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(plan.Departed(1));
  EXPECT_FALSE(plan.Departed(2));
  EXPECT_FALSE(*plan.Adopt(w)) << "the same epoch again";
  for (auto bad : {std::vector<int32_t>{2, 0}, std::vector<int32_t>{0, 3}, std::vector<int32_t>{},
                   std::vector<int32_t>{-1, 0}}) {
    v1::WorldInfo b;
    b.set_epoch(9);
    b.set_from_step(60);
    for (int32_t m : bad) b.add_members(m);
    EXPECT_EQ(plan.Adopt(b).status().code(), StatusCode::kInvalidArgument) << bad.size();
  }
  EXPECT_EQ(WorldPlan(2, 2, ElasticBounds{}).Adopt(w).status().code(), StatusCode::kInvalidArgument);
  auto r = plan.Resize(1, "", 0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch(), 3);
}

TEST(WorldPlanTest, AResizeNoWorkerReportsIsGivenUpAfterTheLimit) {
  WorldPlan plan(2, 2, Bounds(1, 2));
  ASSERT_TRUE(plan.Resize(1, "", 1000).ok());
  EXPECT_EQ(plan.AbandonUnreported(1000 + 59999, 60000), "");
  const std::string why = plan.AbandonUnreported(1000 + 60000, 60000);
  EXPECT_NE(why.find("no worker reached a step boundary within 60 s"), std::string::npos) << why;
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_EQ(plan.AbandonUnreported(1000 + 70000, 60000), "") << "said once";
  auto again = plan.Resize(1, "", 80000);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->epoch(), 1) << "the epoch given up is used again";
  // Once a member reported, the resize is not given up (the others will report).
  v1::WorldInfo w;
  ASSERT_TRUE(plan.Reach(0, 1, 5, 80001, &w).ok());
  EXPECT_EQ(plan.AbandonUnreported(80000 + 600000, 60000), "");
}

TEST(WorldPlanTest, ReportsOfAnUnknownResizeOrANegativeStepAreRefused) {
  WorldPlan plan(2, 2, Bounds(1, 2));
  v1::WorldInfo w;
  EXPECT_EQ(plan.Reach(0, 1, 5, 0, &w).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(plan.Resize(1, "", 0).ok());
  EXPECT_EQ(plan.Reach(0, 2, 5, 0, &w).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(plan.Reach(0, 1, -1, 0, &w).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.Reach(7, 1, 5, 0, &w).status().code(), StatusCode::kInvalidArgument);
}

// Servers (spec.elastic.minServers/maxServers): a resize of the servers keeps the members, is
// refused outside the bounds naming them, waits for the servers it adds to be ready before the
// members hear of it, and is decided by the members' reports like a worker resize. One kind at a
// time.
TEST(WorldPlanTest, ServersResizeWithinTheirBoundsOnceTheAddedServersAreReady) {
  ElasticBounds bounds = Bounds(1, 2);
  WorldPlan fixed(2, 2, bounds, 2);
  auto r = fixed.ResizeServers(3, {}, "", 0);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("outside spec.elastic [2, 2] (minServers, maxServers: both default to "
                                      "spec.servers.replicas)"),
            std::string::npos)
      << r.status().message();
  EXPECT_EQ(WorldPlan(2, 2, ElasticBounds{}, 2).ResizeServers(3, {}, "", 0).status().code(),
            StatusCode::kFailedPrecondition);

  bounds.min_servers = 1;
  bounds.max_servers = 3;
  WorldPlan plan(2, 2, bounds, 2);
  EXPECT_EQ(plan.servers(), 2);
  r = plan.ResizeServers(4, {}, "", 0);
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("outside spec.elastic [1, 3] (minServers, maxServers)"), std::string::npos)
      << r.status().message();
  auto same = plan.ResizeServers(2, {}, "", 0);
  ASSERT_TRUE(same.ok() && same->epoch() == 0) << "nothing to do";

  // 2 -> 3: server 2 is not ready yet, so the members are not told.
  r = plan.ResizeServers(3, {2}, "trellis-launch resize", 1000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch(), 1);
  EXPECT_EQ(plan.pending_servers(), 3);
  EXPECT_EQ(plan.pending_members(), (std::vector<int32_t>{0, 1})) << "the workers stay";
  EXPECT_EQ(plan.announced_epoch(), 0);
  EXPECT_EQ(plan.Resize(1, "", 1000).status().code(), StatusCode::kFailedPrecondition) << "one at a time";
  EXPECT_NE(plan.Resize(1, "", 1000).status().message().find("a resize to 3 servers is under way"),
            std::string::npos);
  EXPECT_FALSE(plan.ServerReady(1, 1100)) << "not a server it adds";
  EXPECT_TRUE(plan.ServerReady(2, 1200));
  EXPECT_EQ(plan.announced_epoch(), 1);
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(0, 1, 10, 1300, &w));
  ASSERT_TRUE(*plan.Reach(1, 1, 11, 1400, &w));
  EXPECT_EQ(w.servers(), 3);
  EXPECT_EQ(w.from_step(), 13);
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(plan.servers(), 3);
  EXPECT_EQ(plan.pending_servers(), 0);
  EXPECT_EQ(plan.resizes().back().from_servers(), 2);
  EXPECT_EQ(plan.resizes().back().to_servers(), 3);
  EXPECT_EQ(plan.resizes().back().to_workers(), 2);

  // 3 -> 1 removes servers: announced at once.
  ASSERT_TRUE(plan.ResizeServers(1, {}, "", 2000).ok());
  EXPECT_EQ(plan.announced_epoch(), 2);
  ASSERT_FALSE(*plan.Reach(0, 2, 20, 2100, &w));
  ASSERT_TRUE(*plan.Reach(1, 2, 20, 2100, &w));
  EXPECT_EQ(w.servers(), 1);
  EXPECT_EQ(w.from_step(), 22);
  // A worker resize keeps the servers of the world.
  ASSERT_TRUE(plan.Resize(1, "", 3000).ok());
  ASSERT_FALSE(*plan.Reach(0, 3, 30, 3100, &w));
  ASSERT_TRUE(*plan.Reach(1, 3, 30, 3100, &w));
  EXPECT_EQ(w.servers(), 1);
  EXPECT_EQ(Members(w), (std::vector<int32_t>{0}));

  // A world handed back after a scheduler restart names its servers, within the bounds.
  WorldPlan restarted(2, 2, bounds, 2);
  v1::WorldInfo back = w;
  back.set_servers(4);
  EXPECT_EQ(restarted.Adopt(back).status().code(), StatusCode::kInvalidArgument);
  back.set_servers(1);
  ASSERT_TRUE(*restarted.Adopt(back));
  EXPECT_EQ(restarted.servers(), 1);
}

// A server the grow adds that never reports ready gives the grow up after the limit, naming it.
TEST(WorldPlanTest, AServerGrowWhoseServerNeverStartsIsGivenUp) {
  ElasticBounds bounds = Bounds(2, 2);
  bounds.max_servers = 3;
  WorldPlan plan(2, 2, bounds, 1);
  ASSERT_TRUE(plan.ResizeServers(3, {1, 2}, "", 1000).ok());
  EXPECT_FALSE(plan.ServerReady(1, 1100));
  EXPECT_EQ(plan.announced_epoch(), 0) << "server 2 is not ready";
  EXPECT_EQ(plan.AbandonUnreported(1000 + WorldPlan::kUnreportedLimitMs - 1, WorldPlan::kUnreportedLimitMs), "");
  const std::string why =
      plan.AbandonUnreported(1000 + WorldPlan::kUnreportedLimitMs, WorldPlan::kUnreportedLimitMs);
  EXPECT_NE(why.find("resize to 3 servers given up: server 2 did not start and report ready"), std::string::npos)
      << why;
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_EQ(plan.servers(), 1);
  auto again = plan.ResizeServers(2, {}, "", 70000);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(plan.announced_epoch(), 1) << "server 1 is ready: announced at once";
}

// A server the grow adds that exits before it was ready gives the grow up at once, naming it;
// once the grow was announced (every added server ready), an exit does not.
TEST(WorldPlanTest, AServerGrowWhoseServerExitsBeforeItWasReadyIsGivenUpAtOnce) {
  ElasticBounds bounds = Bounds(2, 2);
  bounds.max_servers = 4;
  WorldPlan plan(2, 2, bounds, 2);
  EXPECT_EQ(plan.ServerExited(2, "exit code 1"), "") << "no resize under way";
  ASSERT_TRUE(plan.ResizeServers(4, {2, 3}, "", 1000).ok());
  EXPECT_EQ(plan.ServerExited(1, "exit code 1"), "") << "a server of the world: not the grow's";
  EXPECT_FALSE(plan.ServerReady(2, 1100));
  const std::string why = plan.ServerExited(3, "exit code 1");
  EXPECT_EQ(why, "resize to 4 servers given up: server 3 exited (exit code 1) before it was ready (its log says "
                 "why); the job runs on with 2 servers");
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_EQ(plan.servers(), 2);

  ASSERT_TRUE(plan.ResizeServers(3, {}, "", 2000).ok());
  EXPECT_EQ(plan.announced_epoch(), 1);
  EXPECT_EQ(plan.ServerExited(2, "exit code 1"), "") << "announced: the members decide it";
  EXPECT_EQ(plan.pending_epoch(), 1);
}

// Through the scheduler's state: the ping announces the resize, a waiting report is answered by
// the report that decides it, the departed worker's exit does not end the job, barriers wait
// for the world's members only, and the job's progress carries the world and the last resize.
class WorldStateTest : public ::testing::Test {
 protected:
  // 2 workers and 1 server, every pod registered; elastic 1..max_workers().
  virtual int32_t max_workers() const { return 2; }
  void SetUp() override {
    SchedulerConfig c;
    c.num_servers = 1;
    c.num_workers = 2;
    c.elastic = Bounds(1, max_workers());
    state_ = std::make_unique<SchedulerState>(c, &clock_);
    elastic_testing::RegisterPods(state_.get(), 2);
  }
  v1::ReachStepRequest Reach(int32_t rank, int64_t step, bool wait) {
    v1::ReachStepRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_epoch(1);
    r.set_step(step);
    r.set_wait(wait);
    return r;
  }
  SteadyClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

TEST_F(WorldStateTest, AResizeIsAnnouncedDecidedAndTheDepartedWorkersExitIsNotTheJobsEnd) {
  EXPECT_EQ(state_->Ping().resize_epoch(), 0);
  v1::ResizeRequest req;
  req.set_workers(1);
  req.set_reason("test");
  auto r = state_->Resize(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(state_->Ping().resize_epoch(), 1);

  std::optional<StatusOr<v1::ReachStepResponse>> first, waiting, last;
  state_->ReachStep(Reach(1, 10, false), Clock::TimePoint::max(), [&](auto a) { first = a; });
  ASSERT_TRUE(first.has_value() && first->ok());
  EXPECT_FALSE((*first)->decided());
  state_->ReachStep(Reach(1, 11, true), Clock::TimePoint::max(), [&](auto a) { waiting = a; });
  EXPECT_FALSE(waiting.has_value()) << "a waiting report waits for the decision";
  state_->ReachStep(Reach(0, 10, false), Clock::TimePoint::max(), [&](auto a) { last = a; });
  ASSERT_TRUE(last.has_value() && last->ok());
  ASSERT_TRUE(waiting.has_value() && waiting->ok());
  EXPECT_TRUE((*last)->decided());
  EXPECT_TRUE((*waiting)->decided());
  EXPECT_EQ((*waiting)->world().from_step(), 13);
  EXPECT_EQ(state_->Ping().resize_epoch(), 0);
  EXPECT_EQ(state_->GetCluster().world().members_size(), 1);
  EXPECT_EQ(state_->stats().resizes, 1);
  EXPECT_EQ(state_->stats().world_workers, 1);

  // Worker 1 leaves and exits 0: the job goes on (Training), unlike a finished worker's exit.
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(1);
  exit.set_exit_code(0);
  ASSERT_TRUE(state_->ReportExit(exit).ok());
  EXPECT_TRUE(state_->Training());

  // A barrier is the world's: worker 0 alone passes it.
  std::optional<StatusOr<v1::BarrierResponse>> passed;
  v1::BarrierRequest b;
  b.set_name("end");
  b.set_role(v1::ROLE_WORKER);
  b.set_rank(0);
  state_->Barrier(b, Clock::TimePoint::max(), [&](auto a) { passed = a; });
  ASSERT_TRUE(passed.has_value());
  EXPECT_TRUE(passed->ok()) << passed->status().ToString();

  int64_t pending = -1;
  std::vector<v1::ResizeInfo> resizes;
  const v1::WorldInfo world = state_->World(&pending, &resizes);
  EXPECT_EQ(pending, 0);
  ASSERT_EQ(resizes.size(), 1u);
  EXPECT_EQ(resizes[0].from_workers(), 2);
  EXPECT_EQ(resizes[0].to_workers(), 1);
  EXPECT_EQ(world.from_step(), 13);
}

// Growing back: the slot resized away registers again (its agent started anew: no restart), asks
// to join and waits; only then do the pings announce it; the member's report decides, and the
// joiner counts for barriers again.
TEST_F(WorldStateTest, AWorkerResizedAwayJoinsAgainOnceItAsked) {
  v1::ResizeRequest req;
  req.set_workers(1);
  ASSERT_TRUE(state_->Resize(req).ok());
  std::optional<StatusOr<v1::ReachStepResponse>> a, b, joined;
  state_->ReachStep(Reach(0, 10, false), Clock::TimePoint::max(), [&](auto r) { a = r; });
  state_->ReachStep(Reach(1, 10, false), Clock::TimePoint::max(), [&](auto r) { b = r; });
  ASSERT_TRUE(b.has_value() && b->ok() && (*b)->decided());
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(1);
  ASSERT_TRUE(state_->ReportExit(exit).ok());

  req.set_workers(2);
  auto r = state_->Resize(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->epoch(), 2);
  EXPECT_EQ(state_->Ping().resize_epoch(), 0) << "not before the joiner asked";
  v1::RegisterRequest again;
  again.set_role(v1::ROLE_WORKER);
  again.set_pod_name("job-worker-1");
  ASSERT_TRUE(state_->Register(again).ok());
  v1::ReachStepRequest join = Reach(1, -1, true);
  join.set_incarnation(2);
  join.set_epoch(2);
  state_->ReachStep(join, Clock::TimePoint::max(), [&](auto r) { joined = r; });
  EXPECT_FALSE(joined.has_value()) << "the joiner waits for the decision";
  EXPECT_EQ(state_->Ping().resize_epoch(), 2);
  v1::ReachStepRequest report = Reach(0, 20, false);
  report.set_epoch(2);
  a.reset();
  state_->ReachStep(report, Clock::TimePoint::max(), [&](auto r) { a = r; });
  ASSERT_TRUE(a.has_value() && a->ok() && (*a)->decided());
  ASSERT_TRUE(joined.has_value() && joined->ok()) << joined->status().ToString();
  ASSERT_TRUE((*joined)->decided());
  EXPECT_EQ((*joined)->world().members_size(), 2);
  EXPECT_EQ((*joined)->world().from_step(), 22);
  EXPECT_EQ(state_->stats().world_workers, 2);
  EXPECT_EQ(state_->stats().restarts, 0) << "joining is no restart";

  // A barrier waits for the joiner again.
  std::optional<StatusOr<v1::BarrierResponse>> passed;
  v1::BarrierRequest barrier;
  barrier.set_name("end");
  barrier.set_role(v1::ROLE_WORKER);
  barrier.set_rank(0);
  state_->Barrier(barrier, Clock::TimePoint::max(), [&](auto r) { passed = r; });
  EXPECT_FALSE(passed.has_value());
  barrier.set_rank(1);
  state_->Barrier(barrier, Clock::TimePoint::max(), [&](auto) {});
  EXPECT_TRUE(passed.has_value());
}

TEST_F(WorldStateTest, AWaitingReportIsAnsweredUndecidedAtItsDeadlineAndFailedAtShutdown) {
  v1::ResizeRequest req;
  req.set_workers(1);
  ASSERT_TRUE(state_->Resize(req).ok());
  std::optional<StatusOr<v1::ReachStepResponse>> a, b;
  state_->ReachStep(Reach(0, 3, true), clock_.Now(), [&](auto r) { a = r; });
  EXPECT_FALSE(a.has_value());
  state_->Sweep();
  ASSERT_TRUE(a.has_value() && a->ok());
  EXPECT_FALSE((*a)->decided());
  state_->ReachStep(Reach(0, 4, true), Clock::TimePoint::max(), [&](auto r) { b = r; });
  state_->Shutdown();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->status().code(), StatusCode::kUnavailable);
}

// Growing beyond the first size (docs/elastic.md#growing): a job started with 2 workers of
// maxWorkers 4 is complete with its 2, names 4 worker ranks, and the pods of the slots never used
// register into them (not a restart) and join like any other joiner. Once every worker that ran
// finished, a pod stop is the run's end, whatever the slots that never ran.
TEST(WorldStateBeyondTest, AJobGrowsFromTwoIntoSlotsItNeverUsedAndEndsWithoutThem) {
  SteadyClock clock;
  SchedulerConfig c;
  c.num_servers = 1;
  c.num_workers = 2;
  c.elastic = Bounds(1, 4);
  SchedulerState state(c, &clock);
  auto register_pod = [&](v1::Role role, const std::string& pod) {
    v1::RegisterRequest req;
    req.set_role(role);
    req.set_pod_name(pod);
    auto r = state.Register(req);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->rank() : -1;
  };
  ASSERT_EQ(register_pod(v1::ROLE_WORKER, "job-worker-1"), 1);
  ASSERT_EQ(register_pod(v1::ROLE_WORKER, "job-worker-0"), 0);
  ASSERT_EQ(register_pod(v1::ROLE_SERVER, "job-server-0"), 0);
  v1::ReportReadyRequest ready;
  ready.set_role(v1::ROLE_SERVER);
  ready.set_address("127.0.0.1:1");
  ASSERT_TRUE(state.ReportReady(ready).ok());
  v1::ClusterView view = state.GetCluster();
  EXPECT_TRUE(view.complete()) << "the first 2 of 4 slots make the world";
  EXPECT_EQ(view.num_workers(), 4);
  EXPECT_EQ(Members(view.world()), (std::vector<int32_t>{0, 1}));

  v1::ResizeRequest grow;
  grow.set_workers(4);
  auto r = state.Resize(grow);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(register_pod(v1::ROLE_WORKER, "job-worker-3"), 3);
  ASSERT_EQ(register_pod(v1::ROLE_WORKER, "job-worker-2"), 2);
  auto reach = [&](int32_t rank, int64_t step, bool wait, std::optional<StatusOr<v1::ReachStepResponse>>* out) {
    v1::ReachStepRequest q;
    q.set_rank(rank);
    q.set_incarnation(1);
    q.set_epoch(1);
    q.set_step(step);
    q.set_wait(wait);
    state.ReachStep(q, Clock::TimePoint::max(), [out](auto a) { *out = a; });
  };
  std::optional<StatusOr<v1::ReachStepResponse>> j2, j3, m0, m1;
  reach(2, -1, true, &j2);
  EXPECT_EQ(state.Ping().resize_epoch(), 0) << "worker 3 has not asked to join";
  reach(3, -1, true, &j3);
  EXPECT_EQ(state.Ping().resize_epoch(), 1);
  reach(0, 40, false, &m0);
  reach(1, 41, false, &m1);
  ASSERT_TRUE(m1.has_value() && m1->ok() && (*m1)->decided());
  ASSERT_TRUE(j2.has_value() && j2->ok() && (*j2)->decided());
  ASSERT_TRUE(j3.has_value() && j3->ok() && (*j3)->decided());
  EXPECT_EQ(Members((*j3)->world()), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ((*j3)->world().from_step(), 43);
  EXPECT_EQ(state.stats().world_workers, 4);
  EXPECT_EQ(state.stats().restarts, 0) << "a slot's first pod is no restart";
}

// WorldStateTest's job with maxWorkers 4.
class GrowBeyondStateTest : public WorldStateTest {
 protected:
  int32_t max_workers() const override { return 4; }
};

// A joiner whose program ends before it asks to join (it cannot take the job's state, or it
// crashed) gives the grow up at once, naming it; the job is not failed by it and runs on; a
// grow asked again works.
TEST_F(GrowBeyondStateTest, AJoinerThatExitsBeforeJoiningGivesTheGrowUpNotTheJob) {
  SchedulerState& state = *state_;
  v1::ResizeRequest grow;
  grow.set_workers(3);
  ASSERT_TRUE(state.Resize(grow).ok());
  v1::RegisterRequest joiner;
  joiner.set_role(v1::ROLE_WORKER);
  joiner.set_pod_name("job-worker-2");
  ASSERT_TRUE(state.Register(joiner).ok());
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(2);
  exit.set_exit_code(1);
  ASSERT_TRUE(state.ReportExit(exit).ok());
  EXPECT_FALSE(state.GetCluster().failed()) << state.GetCluster().failure_message();
  int64_t pending = -1;
  EXPECT_EQ(state.World(&pending, nullptr).members_size(), 2);
  EXPECT_EQ(pending, 0) << "the grow is given up at once";
  EXPECT_TRUE(state.Training());

  // A member's failure still fails the job.
  WorldPlan plan(2, 4, Bounds(1, 4));
  ASSERT_TRUE(plan.Resize(4, "", 0).ok());
  EXPECT_EQ(plan.JoinerExited(1, "exit code 1"), "") << "a member, not a joiner";
  v1::WorldInfo w;
  ASSERT_FALSE(*plan.Reach(2, 1, -1, 0, &w));
  EXPECT_EQ(plan.JoinerExited(2, "exit code 1"), "") << "asked to join already: a member's failure then";
  const std::string why = plan.JoinerExited(3, "exit code 0");
  EXPECT_NE(why.find("worker 3 exited (exit code 0) before it asked to join"), std::string::npos) << why;
  EXPECT_EQ(plan.pending_epoch(), 0);
  EXPECT_TRUE(plan.Resize(3, "again", 0).ok());
}

TEST_F(GrowBeyondStateTest, APodStopAfterEveryWorkerThatRanFinishedIsTheRunsEnd) {
  SchedulerState& state = *state_;
  for (int32_t w : {0, 1}) {
    v1::ReportExitRequest exit;
    exit.set_role(v1::ROLE_WORKER);
    exit.set_rank(w);
    ASSERT_TRUE(state.ReportExit(exit).ok());
  }
  v1::ReportExitRequest stop;  // the server's pod deleted as the run ends
  stop.set_role(v1::ROLE_SERVER);
  stop.set_exit_code(143);
  stop.set_preempted(true);
  ASSERT_TRUE(state.ReportExit(stop).ok());
  EXPECT_FALSE(state.GetCluster().servers(0).preempted())
      << "workers 2 and 3 never ran: nothing waits for a replacement";
}

}  // namespace
}  // namespace trellis
