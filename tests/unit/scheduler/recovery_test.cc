// A restarted scheduler rebuilds a running job's state from its members
// (docs/scheduler.md#scheduler-restart): a fresh SchedulerState gets the registrations, ready
// reports and Resume calls the members of a job run by an earlier state make, and must end with
// the same ranks, incarnations, addresses, the identical shard map, barriers that go on, and
// nobody declared dead while they come back.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/state_answer.h"
#include "scheduler/shard_map.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using testing::Answer;

v1::KeySpec Key(uint64_t id, int64_t n) {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name("k" + std::to_string(id));
  k.set_num_elements(n);
  k.set_dtype(v1::DTYPE_FLOAT32);
  return k;
}

constexpr int kServers = 2;
constexpr int kWorkers = 3;

SchedulerConfig Config() {
  SchedulerConfig c;
  c.job_name = "mlp";
  c.num_servers = kServers;
  c.num_workers = kWorkers;
  c.slice_bytes = 16;
  c.heartbeat_timeout = 5s;
  c.recovery_grace = 20s;
  return c;
}

v1::RegisterRequest RegReq(v1::Role role, int i) {
  v1::RegisterRequest r;
  r.set_job("mlp");
  r.set_role(role);
  r.set_pod_name(std::string("mlp-") + (role == v1::ROLE_SERVER ? "server-" : "worker-") +
                 std::to_string(i));
  r.set_host("10.0.0." + std::to_string(i));
  return r;
}

// What an agent holding `rank` sends once the scheduler no longer knows it.
v1::RegisterRequest ResumeReg(v1::Role role, int i, int64_t incarnation, int32_t restarts) {
  v1::RegisterRequest r = RegReq(role, i);
  r.set_previous_rank(i);
  r.set_previous_incarnation(incarnation);
  r.set_previous_restarts(restarts);
  r.set_resume(true);
  return r;
}

class RecoveryTest : public ::testing::Test {
 protected:
  // The job before the crash: every node registered, servers ready, the map built and then
  // extended (deferred init: an extended map is not what BuildShardMap makes of all its keys),
  // barrier "epoch" released twice, worker 1 restarted once.
  void RunOldScheduler() {
    old_ = std::make_unique<SchedulerState>(Config(), &clock_);
    for (int i = 0; i < kServers; ++i) {
      ASSERT_TRUE(old_->Register(RegReq(v1::ROLE_SERVER, i)).ok());
      v1::ReportReadyRequest ready;
      ready.set_role(v1::ROLE_SERVER);
      ready.set_rank(i);
      ready.set_address(Address(i));
      ASSERT_TRUE(old_->ReportReady(ready).ok());
    }
    for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(old_->Register(RegReq(v1::ROLE_WORKER, i)).ok());
    ASSERT_TRUE(old_->Register(RegReq(v1::ROLE_WORKER, 1)).ok());  // worker 1 restarted
    DeclareAll(old_.get(), {Key(1, 10)});
    DeclareAll(old_.get(), {Key(1, 10), Key(2, 3), Key(3, 9)});
    map_ = got_map_;
    ASSERT_EQ(map_.keys_size(), 3);
    auto rebuilt = BuildShardMap({Key(1, 10), Key(2, 3), Key(3, 9)}, kServers, "roundRobin", 16);
    ASSERT_TRUE(rebuilt.ok());
    ASSERT_NE(ShardMapBytes(*rebuilt), ShardMapBytes(map_))
        << "the test needs a map that a rebuild from the keys would get wrong";
    for (int gen = 0; gen < 2; ++gen) {
      std::vector<Answer<v1::BarrierResponse>> a(kWorkers);
      for (int i = 0; i < kWorkers; ++i) Arrive(old_.get(), i, gen, &a[i]);
      for (auto& x : a) ASSERT_TRUE(x.done() && x.got->ok());
    }
    old_view_ = old_->GetCluster();
    old_.reset();  // the crash
  }
  void DeclareAll(SchedulerState* s, std::vector<v1::KeySpec> keys) {
    std::vector<Answer<std::shared_ptr<const v1::ShardMap>>> a(kWorkers);
    for (int i = 0; i < kWorkers; ++i) Declare(s, i, keys, &a[i]);
    for (auto& x : a) ASSERT_TRUE(x.done() && x.got->ok()) << x.status().ToString();
    got_map_ = ***a[0].got;
  }
  void Declare(SchedulerState* s, int rank, const std::vector<v1::KeySpec>& keys,
               Answer<std::shared_ptr<const v1::ShardMap>>* a) {
    v1::DeclareKeysRequest r;
    r.set_worker_rank(rank);
    for (const auto& k : keys) *r.add_keys() = k;
    s->DeclareKeys(r, clock_.Now() + 60s, a->Cb());
  }
  void Arrive(SchedulerState* s, int rank, int64_t gen, Answer<v1::BarrierResponse>* a) {
    v1::BarrierRequest r;
    r.set_name("epoch");
    r.set_role(v1::ROLE_WORKER);
    r.set_rank(rank);
    r.set_generation(gen);
    s->Barrier(r, clock_.Now() + 60s, a->Cb());
  }
  static std::string Address(int i) { return "10.0.0." + std::to_string(i) + ":700" + std::to_string(i); }
  v1::ResumeRequest Handback(int rank) const {
    v1::ResumeRequest r;
    r.set_rank(rank);
    r.set_incarnation(old_view_.workers(rank).incarnation());
    *r.mutable_shard_map() = map_;
    for (const auto& s : old_view_.servers()) r.add_server_addresses(s.address());
    return r;
  }
  // Every agent of the old job registers again, the program running on.
  void AgentsComeBack(SchedulerState* s, int workers = kWorkers) {
    for (int i = 0; i < kServers; ++i) {
      const auto& n = old_view_.servers(i);
      auto r = s->Register(ResumeReg(v1::ROLE_SERVER, i, n.incarnation(), n.restarts()));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
    }
    for (int i = 0; i < workers; ++i) {
      const auto& n = old_view_.workers(i);
      auto r = s->Register(ResumeReg(v1::ROLE_WORKER, i, n.incarnation(), n.restarts()));
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->rank(), i);
      EXPECT_EQ(r->incarnation(), n.incarnation());
    }
  }

  ManualClock clock_;
  std::unique_ptr<SchedulerState> old_;
  v1::ClusterView old_view_;
  v1::ShardMap map_;
  v1::ShardMap got_map_;
};

TEST_F(RecoveryTest, RestartedSchedulerRebuildsTheRunningJob) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  // Worker 2 hands back first, before any agent registered again.
  ASSERT_TRUE(fresh.Resume(Handback(2)).ok());
  EXPECT_TRUE(fresh.Ping().recovering());
  AgentsComeBack(&fresh);
  for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(fresh.Resume(Handback(i)).ok());
  EXPECT_FALSE(fresh.Ping().recovering()) << "everyone is back";

  const v1::ClusterView v = fresh.GetCluster();
  EXPECT_TRUE(v.complete());
  for (int i = 0; i < kServers; ++i) {
    EXPECT_EQ(v.servers(i).pod_name(), old_view_.servers(i).pod_name());
    EXPECT_EQ(v.servers(i).address(), old_view_.servers(i).address());
    EXPECT_TRUE(v.servers(i).ready());
  }
  for (int i = 0; i < kWorkers; ++i) {
    EXPECT_EQ(v.workers(i).pod_name(), old_view_.workers(i).pod_name());
    EXPECT_EQ(v.workers(i).incarnation(), old_view_.workers(i).incarnation());
    EXPECT_EQ(v.workers(i).restarts(), old_view_.workers(i).restarts());
    EXPECT_FALSE(v.workers(i).dead());
  }
  EXPECT_EQ(v.workers(1).incarnation(), 2);

  // A worker restarting now declares its keys and gets the very map the servers hold, at once.
  Answer<std::shared_ptr<const v1::ShardMap>> d;
  Declare(&fresh, 1, {Key(3, 9), Key(1, 10), Key(2, 3)}, &d);
  ASSERT_TRUE(d.done() && d.got->ok()) << d.status().ToString();
  EXPECT_EQ(ShardMapBytes(***d.got), ShardMapBytes(map_));

  // Barriers go on at the workers' generation: 2 (0 and 1 were released by the old scheduler).
  std::vector<Answer<v1::BarrierResponse>> b(kWorkers);
  Arrive(&fresh, 0, 2, &b[0]);
  Arrive(&fresh, 1, 2, &b[1]);
  EXPECT_FALSE(b[0].done());
  Arrive(&fresh, 2, 2, &b[2]);
  for (auto& x : b) ASSERT_TRUE(x.done() && x.got->ok()) << x.status().ToString();
  Answer<v1::BarrierResponse> late;  // a retry of a generation already passed
  Arrive(&fresh, 2, 1, &late);
  ASSERT_TRUE(late.done() && late.got->ok());
}

// An elastic job resized 3 -> 2 before the crash (docs/elastic.md#what-survives-what): the
// workers hand back their world; the new scheduler adopts it, does not wait for the worker
// resized away, and numbers the next resize after it.
TEST_F(RecoveryTest, AnElasticJobsWorldIsHandedBackAndTheWorkerResizedAwayIsNotAwaited) {
  RunOldScheduler();
  SchedulerConfig c = Config();
  c.elastic = ElasticBounds{true, 1, kWorkers};
  SchedulerState fresh(c, &clock_);
  v1::WorldInfo world;
  world.set_epoch(1);
  world.set_from_step(40);
  world.add_members(0);
  world.add_members(1);
  AgentsComeBack(&fresh, /*workers=*/2);
  EXPECT_TRUE(fresh.Ping().recovering()) << "worker 2 is still awaited until a world says otherwise";
  v1::ResumeRequest r = Handback(0);
  *r.mutable_world() = world;
  ASSERT_TRUE(fresh.Resume(r).ok());
  EXPECT_FALSE(fresh.Ping().recovering()) << "the world's workers are back";
  const v1::ClusterView v = fresh.GetCluster();
  EXPECT_TRUE(v.complete());
  EXPECT_EQ(v.world().epoch(), 1);
  EXPECT_EQ(v.world().members_size(), 2);
  EXPECT_FALSE(v.workers(2).dead()) << "resized away, not dead";

  // An older or equal world changes nothing; a bad one is refused.
  world.set_epoch(0);
  *r.mutable_world() = world;
  ASSERT_TRUE(fresh.Resume(r).ok());
  EXPECT_EQ(fresh.GetCluster().world().epoch(), 1);
  world.set_epoch(5);
  world.add_members(7);
  *r.mutable_world() = world;
  EXPECT_EQ(fresh.Resume(r).status().code(), StatusCode::kInvalidArgument);

  v1::ResizeRequest resize;
  resize.set_workers(1);
  auto next = fresh.Resize(resize);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->epoch(), 2) << "numbered after the world handed back";
}

TEST_F(RecoveryTest, BarrierWaitersOfALostReleaseArePassedByANewerArrival) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  AgentsComeBack(&fresh);
  // Workers 0 and 1 never got the answer of generation 2 (the old scheduler died sending it)
  // and ask again; worker 2 did and is already at 3.
  std::vector<Answer<v1::BarrierResponse>> b(kWorkers);
  Arrive(&fresh, 0, 2, &b[0]);
  Arrive(&fresh, 1, 2, &b[1]);
  EXPECT_FALSE(b[0].done());
  Arrive(&fresh, 2, 3, &b[2]);
  ASSERT_TRUE(b[0].done() && b[0].got->ok()) << b[0].status().ToString();
  ASSERT_TRUE(b[1].done() && b[1].got->ok());
  EXPECT_FALSE(b[2].done()) << "generation 3 waits for the others";
  fresh.Shutdown();  // answers it while `b` lives
}

TEST_F(RecoveryTest, NobodyIsDeadDuringTheGraceAndTheMissingAreDeadAfterIt) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  AgentsComeBack(&fresh, /*workers=*/2);  // worker 2 does not come back
  clock_.Advance(15s);                    // 3 heartbeat timeouts, inside the 20 s grace
  fresh.Sweep();
  v1::ClusterView v = fresh.GetCluster();
  for (const auto* list : {&v.servers(), &v.workers()}) {
    for (const auto& n : *list) EXPECT_FALSE(n.dead()) << n.pod_name();
  }
  EXPECT_TRUE(v.recovering());

  clock_.Advance(6s);  // the grace is over
  fresh.Sweep();
  v = fresh.GetCluster();
  EXPECT_FALSE(v.recovering());
  EXPECT_TRUE(v.workers(2).dead());
  EXPECT_FALSE(v.workers(0).dead()) << "heartbeat timeouts start afresh at the end of the grace";
  EXPECT_EQ(fresh.stats().dead_detected, 1);

  // The pod comes back late: it gets its rank back and is alive again.
  const auto& n = old_view_.workers(2);
  auto r = fresh.Register(ResumeReg(v1::ROLE_WORKER, 2, n.incarnation(), n.restarts()));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank(), 2);
  EXPECT_FALSE(fresh.GetCluster().workers(2).dead());

  // After the grace, heartbeats count again.
  clock_.Advance(6s);
  fresh.Sweep();
  EXPECT_TRUE(fresh.GetCluster().workers(0).dead());
}

TEST_F(RecoveryTest, AReplacementPodTakesTheRankOfAMemberThatNeverCameBack) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  AgentsComeBack(&fresh, /*workers=*/2);
  clock_.Advance(21s);
  fresh.Sweep();
  ASSERT_TRUE(fresh.GetCluster().workers(2).dead());
  // A new pod (its agent never held a rank) of the same name: a restart of rank 2.
  auto r = fresh.Register(RegReq(v1::ROLE_WORKER, 2));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rank(), 2);
  EXPECT_GT(r->incarnation(), 1) << "it joins a running job";
  EXPECT_FALSE(fresh.GetCluster().workers(2).dead());
  // Any further pod is one too many.
  v1::RegisterRequest extra = RegReq(v1::ROLE_WORKER, 9);
  EXPECT_EQ(fresh.Register(extra).status().code(), StatusCode::kResourceExhausted);
}

TEST_F(RecoveryTest, AProgramRestartedDuringTheOutageGetsANewIncarnation) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  v1::RegisterRequest r = ResumeReg(v1::ROLE_SERVER, 1, 1, 0);
  r.set_resume(false);  // the agent is starting its program again
  r.set_previous_restarts(1);
  ASSERT_TRUE(fresh.Resume(Handback(0)).ok());  // knows server 1's old address
  auto got = fresh.Register(r);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->incarnation(), 2);
  const v1::ClusterView v = fresh.GetCluster();
  EXPECT_EQ(v.servers(1).restarts(), 1);
  EXPECT_FALSE(v.servers(1).ready()) << "a restarted server reports its new address itself";
  EXPECT_TRUE(v.servers(0).ready()) << "server 0's address came back from worker 0";
}

TEST_F(RecoveryTest, AResumeToASchedulerThatKnowsThePodChangesNothing) {
  SchedulerState s(Config(), &clock_);
  ASSERT_TRUE(s.Register(RegReq(v1::ROLE_WORKER, 0)).ok());
  auto r = s.Register(ResumeReg(v1::ROLE_WORKER, 0, 1, 0));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->incarnation(), 1);
  EXPECT_EQ(s.GetCluster().workers(0).restarts(), 0);
  EXPECT_FALSE(s.Ping().recovering());
}

TEST_F(RecoveryTest, BadHandbacksAreRefused) {
  RunOldScheduler();
  SchedulerState fresh(Config(), &clock_);
  v1::ResumeRequest wrong = Handback(0);
  wrong.mutable_shard_map()->set_num_servers(3);
  EXPECT_THAT(fresh.Resume(wrong).status().message(), HasSubstr("the map is for 3 servers"));
  v1::ResumeRequest gap = Handback(0);
  gap.mutable_shard_map()->mutable_keys(0)->mutable_slices(1)->set_offset(99);
  EXPECT_EQ(fresh.Resume(gap).status().code(), StatusCode::kInvalidArgument);
  v1::ResumeRequest bad_rank = Handback(0);
  bad_rank.set_rank(7);
  EXPECT_EQ(fresh.Resume(bad_rank).status().code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(fresh.Resume(Handback(0)).ok());
  v1::ResumeRequest other = Handback(1);
  other.mutable_shard_map()->mutable_keys(0)->mutable_slices(0)->set_server(1);
  other.mutable_shard_map()->mutable_keys(0)->mutable_slices(1)->set_server(0);
  EXPECT_THAT(fresh.Resume(other).status().message(),
              HasSubstr("holds a shard map that differs from the one handed back first"));

  // A pod claiming a rank another pod holds now.
  ASSERT_TRUE(fresh.Register(RegReq(v1::ROLE_WORKER, 0)).ok());
  v1::RegisterRequest claim = ResumeReg(v1::ROLE_WORKER, 0, 1, 0);
  claim.set_pod_name("mlp-worker-x");
  EXPECT_EQ(fresh.Register(claim).status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(RecoveryTest, ARejoinWaitsForTheDonorsToComeBackInsteadOfStartingFresh) {
  RunOldScheduler();
  SchedulerState recovering(Config(), &clock_);
  const auto& n = old_view_.workers(1);
  ASSERT_TRUE(recovering.Register(ResumeReg(v1::ROLE_WORKER, 1, n.incarnation(), 0)).ok());
  v1::RequestRejoinRequest req;
  req.set_rank(1);
  req.set_incarnation(n.incarnation());
  Answer<v1::RequestRejoinResponse> a;
  recovering.RequestRejoin(req, clock_.Now() + 10s, a.Cb());
  ASSERT_TRUE(a.done());
  EXPECT_EQ(a.status().code(), StatusCode::kUnavailable) << "not 'fresh': the donors may come back";

  // Once the donor is back and watching, the rejoin goes to it.
  ASSERT_TRUE(recovering.Register(ResumeReg(v1::ROLE_WORKER, 0, 1, 0)).ok());
  v1::WatchRejoinsRequest w;
  w.set_rank(0);
  w.set_incarnation(1);
  Answer<v1::WatchRejoinsResponse> watch;
  recovering.WatchRejoins(w, clock_.Now() + 10s, watch.Cb());
  ASSERT_TRUE(watch.done() && watch.got->ok());
  Answer<v1::RequestRejoinResponse> b;
  recovering.RequestRejoin(req, clock_.Now() + 10s, b.Cb());
  EXPECT_FALSE(b.done()) << "waits for donor 0 to stash its commit";
  recovering.Shutdown();  // answers it while `b` lives
}

}  // namespace
}  // namespace trellis
