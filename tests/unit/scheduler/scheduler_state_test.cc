#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/state_answer.h"

#include "scheduler/scheduler_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

using testing::Answer;

v1::KeySpec Key(uint64_t id, int64_t n, std::string name = "") {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name(std::move(name));
  k.set_num_elements(n);
  k.set_dtype(v1::DTYPE_FLOAT32);
  return k;
}

class SchedulerStateTest : public ::testing::Test {
 protected:
  void Make(int32_t servers, int32_t workers) {
    SchedulerConfig c;
    c.job_name = "mlp";
    c.num_servers = servers;
    c.num_workers = workers;
    c.slice_bytes = 16;
    c.heartbeat_timeout = 10s;
    ASSERT_TRUE(ValidateSchedulerConfig(c).ok());
    state_ = std::make_unique<SchedulerState>(c, &clock_);
  }
  StatusOr<v1::RegisterResponse> Reg(v1::Role role, const std::string& pod) {
    v1::RegisterRequest r;
    r.set_job("mlp");
    r.set_role(role);
    r.set_pod_name(pod);
    r.set_host("10.0.0.1");
    return state_->Register(r);
  }
  Status Ready(int32_t rank, const std::string& addr) {
    v1::ReportReadyRequest r;
    r.set_role(v1::ROLE_SERVER);
    r.set_rank(rank);
    r.set_address(addr);
    return state_->ReportReady(r);
  }
  // Registers S servers (ready) and W workers.
  void Boot(int32_t servers, int32_t workers) {
    Make(servers, workers);
    for (int i = 0; i < servers; ++i) {
      ASSERT_TRUE(Reg(v1::ROLE_SERVER, "s" + std::to_string(i)).ok());
      ASSERT_TRUE(Ready(i, "10.0.0.1:" + std::to_string(7000 + i)).ok());
    }
    for (int i = 0; i < workers; ++i) ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w" + std::to_string(i)).ok());
  }
  void Declare(int32_t rank, std::vector<v1::KeySpec> keys,
               Answer<std::shared_ptr<const v1::ShardMap>>* a) {
    v1::DeclareKeysRequest r;
    r.set_worker_rank(rank);
    for (auto& k : keys) *r.add_keys() = k;
    state_->DeclareKeys(r, clock_.Now() + 60s, a->Cb());
  }
  void Arrive(const std::string& name, v1::Role role, int32_t rank, int64_t gen,
              Answer<v1::BarrierResponse>* a, bool all_nodes = false) {
    v1::BarrierRequest r;
    r.set_name(name);
    r.set_role(role);
    r.set_rank(rank);
    r.set_generation(gen);
    r.set_all_nodes(all_nodes);
    state_->Barrier(r, clock_.Now() + 30s, a->Cb());
  }
  Status Exit(v1::Role role, int32_t rank, int32_t code, bool will_restart) {
    v1::ReportExitRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_exit_code(code);
    r.set_will_restart(will_restart);
    return state_->ReportExit(r);
  }
  StatusOr<v1::HeartbeatResponse> Beat(v1::Role role, int32_t rank) {
    v1::HeartbeatRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_state("running");
    return state_->Heartbeat(r);
  }

  ManualClock clock_;
  std::unique_ptr<SchedulerState> state_;
};

TEST_F(SchedulerStateTest, RanksInArrivalOrderPerRole) {
  Make(2, 3);
  auto w0 = Reg(v1::ROLE_WORKER, "w-a");
  auto s0 = Reg(v1::ROLE_SERVER, "s-a");
  auto w1 = Reg(v1::ROLE_WORKER, "w-b");
  auto s1 = Reg(v1::ROLE_SERVER, "s-b");
  auto w2 = Reg(v1::ROLE_WORKER, "w-c");
  ASSERT_TRUE(w0.ok() && s0.ok() && w1.ok() && s1.ok() && w2.ok());
  EXPECT_EQ(w0->rank(), 0);
  EXPECT_EQ(w1->rank(), 1);
  EXPECT_EQ(w2->rank(), 2);
  EXPECT_EQ(s0->rank(), 0);
  EXPECT_EQ(s1->rank(), 1);
  EXPECT_EQ(w2->incarnation(), 1);
  EXPECT_EQ(w2->num_servers(), 2);
  EXPECT_EQ(w2->num_workers(), 3);
  auto view = state_->GetCluster();
  EXPECT_EQ(view.workers(1).pod_name(), "w-b");
  EXPECT_EQ(view.servers(1).pod_name(), "s-b");
}

TEST_F(SchedulerStateTest, OrdinalPodNamesGetTheirOrdinalWhateverTheArrivalOrder) {
  Make(1, 4);
  auto w2 = Reg(v1::ROLE_WORKER, "mlp-worker-2");
  auto w0 = Reg(v1::ROLE_WORKER, "mlp-worker-0");
  auto big = Reg(v1::ROLE_WORKER, "mlp-worker-7");   // out of range: lowest free rank
  auto dup = Reg(v1::ROLE_WORKER, "other-worker-0"); // ordinal taken: lowest free rank
  ASSERT_TRUE(w2.ok() && w0.ok() && big.ok() && dup.ok());
  EXPECT_EQ(w2->rank(), 2);
  EXPECT_EQ(w0->rank(), 0);
  EXPECT_EQ(big->rank(), 1);
  EXPECT_EQ(dup->rank(), 3);
  auto again = Reg(v1::ROLE_WORKER, "mlp-worker-2");  // re-registration keeps its rank
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank(), 2);
  EXPECT_EQ(again->incarnation(), 2);
}

TEST_F(SchedulerStateTest, ReRegistrationKeepsRankAndCountsARestart) {
  Make(1, 2);
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w-a").ok());
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w-b").ok());
  auto again = Reg(v1::ROLE_WORKER, "w-a");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank(), 0);
  EXPECT_EQ(again->incarnation(), 2);
  EXPECT_EQ(state_->GetCluster().workers(0).restarts(), 1);
  // An exit reported with will_restart counts the restart; the re-registration after it
  // does not count it twice.
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 1, true).ok());
  auto b = Reg(v1::ROLE_WORKER, "w-b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->rank(), 1);
  EXPECT_EQ(b->incarnation(), 2);
  EXPECT_EQ(state_->GetCluster().workers(1).restarts(), 1);
  EXPECT_EQ(state_->GetCluster().workers(1).last_exit_code(), 1);
  EXPECT_EQ(state_->stats().restarts, 2);
  // Of these, only the one its agent made inside the pod is a program restart (the operator
  // counts the pod's replacements itself).
  EXPECT_EQ(state_->GetCluster().workers(0).program_restarts(), 0);
  EXPECT_EQ(state_->GetCluster().workers(1).program_restarts(), 1);
  // A pod cannot change its role.
  auto wrong = Reg(v1::ROLE_SERVER, "w-a");
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("pod w-a is registered as worker 0"));
}

TEST_F(SchedulerStateTest, TooManyPodsIsResourceExhausted) {
  Make(1, 1);
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w-a").ok());
  auto extra = Reg(v1::ROLE_WORKER, "w-b");
  EXPECT_EQ(extra.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(extra.status().message(),
            "the job expects 1 workers and all ranks are taken; pod w-b cannot register");
  EXPECT_TRUE(Reg(v1::ROLE_SERVER, "s-a").ok());  // servers are counted apart
}

TEST_F(SchedulerStateTest, BadRegistrationsAreInvalidArgument) {
  Make(1, 1);
  EXPECT_EQ(Reg(v1::ROLE_UNSPECIFIED, "x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Reg(v1::ROLE_WORKER, "").status().message(), "pod_name must be set");
  v1::RegisterRequest other;
  other.set_job("other");
  other.set_role(v1::ROLE_WORKER);
  other.set_pod_name("p");
  EXPECT_THAT(state_->Register(other).status().message(),
              HasSubstr("registration for job \"other\" reached the scheduler of job \"mlp\""));
  EXPECT_EQ(Ready(5, "h:1").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Ready(0, "h:1").message(), "server 0 has not registered");
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "s").ok());
  EXPECT_THAT(Ready(0, "").message(), HasSubstr("address"));
}

TEST_F(SchedulerStateTest, ViewIsCompleteOnlyWithEveryoneRegisteredAndServersReady) {
  Make(2, 1);
  int64_t last = state_->GetCluster().version();
  auto step = [&](const char* what) {
    auto v = state_->GetCluster();
    EXPECT_GT(v.version(), last) << what;
    last = v.version();
    return v.complete();
  };
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "s0").ok());
  EXPECT_FALSE(step("s0"));
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "s1").ok());
  EXPECT_FALSE(step("s1"));
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w0").ok());
  EXPECT_FALSE(step("w0"));
  ASSERT_TRUE(Ready(1, "h:2").ok());
  EXPECT_FALSE(step("ready 1"));
  ASSERT_TRUE(Ready(0, "h:1").ok());
  EXPECT_TRUE(step("ready 0"));
  auto v = state_->GetCluster();
  ASSERT_EQ(v.servers_size(), 2);
  EXPECT_EQ(v.servers(0).address(), "h:1");
  EXPECT_TRUE(v.servers(0).ready());
}

TEST_F(SchedulerStateTest, LongPollAnswersOnChangeOrAtTheDeadline) {
  Make(1, 1);
  const int64_t v0 = state_->GetCluster().version();
  Answer<std::shared_ptr<const v1::ClusterView>> any, complete, timed;
  v1::GetClusterRequest after;
  after.set_after_version(v0);
  state_->WaitCluster(after, clock_.Now() + 60s, any.Cb());
  v1::GetClusterRequest wc;
  wc.set_wait_complete(true);
  state_->WaitCluster(wc, clock_.Now() + 60s, complete.Cb());
  state_->WaitCluster(wc, clock_.Now() + 5s, timed.Cb());
  EXPECT_FALSE(any.done());
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "s0").ok());
  ASSERT_TRUE(any.done());
  EXPECT_EQ(any.got->value()->version(), v0 + 1);
  EXPECT_FALSE(complete.done());
  clock_.Advance(6s);
  state_->Sweep();
  ASSERT_TRUE(timed.done());  // the deadline answers with the view as it is
  EXPECT_TRUE(timed.status().ok());
  EXPECT_FALSE(timed.got->value()->complete());
  EXPECT_FALSE(complete.done());
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "w0").ok());
  ASSERT_TRUE(Ready(0, "h:1").ok());
  ASSERT_TRUE(complete.done());
  EXPECT_TRUE(complete.got->value()->complete());
  // Already complete: answers at once.
  Answer<std::shared_ptr<const v1::ClusterView>> now;
  state_->WaitCluster(wc, clock_.Now() + 60s, now.Cb());
  EXPECT_TRUE(now.done());
}

TEST_F(SchedulerStateTest, AllWorkersGetOneMapOnceAllDeclared) {
  Boot(2, 3);
  std::vector<v1::KeySpec> keys = {Key(3, 10, "fc2.weight"), Key(1, 4, "fc1.bias")};
  Answer<std::shared_ptr<const v1::ShardMap>> a0, a1, a2;
  Declare(1, keys, &a1);
  Declare(0, {keys[1], keys[0]}, &a0);  // order does not matter
  EXPECT_FALSE(a0.done());
  EXPECT_FALSE(a1.done());
  Declare(2, keys, &a2);
  ASSERT_TRUE(a0.done() && a1.done() && a2.done());
  ASSERT_TRUE(a0.status().ok()) << a0.status().ToString();
  EXPECT_EQ(a0.got->value().get(), a2.got->value().get());  // the very same map
  const v1::ShardMap& m = *a0.got->value();
  ASSERT_EQ(m.keys_size(), 2);
  EXPECT_EQ(m.keys(0).key().id(), 1u);
  EXPECT_EQ(m.keys(1).slices_size(), 3);
  // A restarted worker declaring the same keys gets the same map at once.
  Answer<std::shared_ptr<const v1::ShardMap>> again;
  Declare(1, keys, &again);
  ASSERT_TRUE(again.done());
  EXPECT_EQ(again.got->value().get(), a0.got->value().get());
  // Unregistered or out-of-range workers are refused on their own.
  Answer<std::shared_ptr<const v1::ShardMap>> bad;
  Declare(7, keys, &bad);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SchedulerStateTest, SizeMismatchFailsWaitersAndLaterCallers) {
  Boot(1, 3);
  std::vector<v1::KeySpec> keys = {Key(1, 4, "fc1.bias"), Key(3, 1024, "fc2.weight")};
  std::vector<v1::KeySpec> other = {Key(1, 4, "fc1.bias"), Key(3, 2048, "fc2.weight")};
  Answer<std::shared_ptr<const v1::ShardMap>> a2, a0, a1;
  Declare(2, other, &a2);  // the odd one out arrives first
  Declare(0, keys, &a0);
  const std::string want =
      "key mismatch: worker 0 declares key 3 \"fc2.weight\" (1024 x float32), worker 2 declares "
      "(2048 x float32)";
  ASSERT_TRUE(a0.done() && a2.done());
  EXPECT_EQ(a2.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a2.status().message(), want);
  EXPECT_EQ(a0.status().message(), want);
  Declare(1, keys, &a1);  // later callers get the same failure
  ASSERT_TRUE(a1.done());
  EXPECT_EQ(a1.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a1.status().message(), want);
}

TEST_F(SchedulerStateTest, MissingKeyIsNamed) {
  Boot(1, 2);
  Answer<std::shared_ptr<const v1::ShardMap>> a0, a1;
  Declare(0, {Key(2, 4, "w"), Key(7, 3, "bias")}, &a0);
  Declare(1, {Key(2, 4, "w")}, &a1);
  ASSERT_TRUE(a0.done() && a1.done());
  EXPECT_EQ(a1.status().message(),
            "key mismatch: worker 1 does not declare key 7 \"bias\" that worker 0 declares");
  EXPECT_EQ(a0.status().message(), a1.status().message());
}

TEST_F(SchedulerStateTest, FirstDifferenceByKeyIdWins) {
  Boot(1, 2);
  Answer<std::shared_ptr<const v1::ShardMap>> a0, a1;
  // Key 9 differs in size and key 4 in name; key 4 comes first by id.
  Declare(0, {Key(9, 1), Key(4, 2, "a")}, &a0);
  Declare(1, {Key(9, 2), Key(4, 2, "b")}, &a1);
  ASSERT_TRUE(a1.done());
  EXPECT_EQ(a1.status().message(),
            "key mismatch: worker 0 declares key 4 \"a\" (2 x float32), worker 1 declares key 4 "
            "\"b\" (2 x float32)");
}

TEST_F(SchedulerStateTest, BadKeysFailOnlyTheCaller) {
  Boot(1, 2);
  Answer<std::shared_ptr<const v1::ShardMap>> bad, a0, a1;
  Declare(0, {Key(1, 0, "empty")}, &bad);
  ASSERT_TRUE(bad.done());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("worker 0: key 1 \"empty\": num_elements"));
  Declare(0, {Key(1, 4)}, &a0);
  Declare(1, {Key(1, 4)}, &a1);
  ASSERT_TRUE(a1.done());
  EXPECT_TRUE(a1.status().ok());
}

TEST_F(SchedulerStateTest, DeclarationDeadlineNamesTheMissingWorkers) {
  Boot(1, 3);
  Answer<std::shared_ptr<const v1::ShardMap>> a1;
  Declare(1, {Key(1, 4)}, &a1);
  clock_.Advance(61s);
  state_->Sweep();
  ASSERT_TRUE(a1.done());
  EXPECT_EQ(a1.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a1.status().message(),
            "waiting for key declarations: 1 of 3 workers declared; missing worker 0, 2");
}

TEST_F(SchedulerStateTest, BarrierGenerations) {
  Boot(1, 2);
  Answer<v1::BarrierResponse> a, b;
  Arrive("init", v1::ROLE_WORKER, 0, 0, &a);
  EXPECT_FALSE(a.done());
  clock_.Advance(2s);
  Arrive("init", v1::ROLE_WORKER, 1, 0, &b);
  ASSERT_TRUE(a.done() && b.done());
  EXPECT_DOUBLE_EQ((*a.got)->waited_seconds(), 2.0);
  EXPECT_DOUBLE_EQ((*b.got)->waited_seconds(), 0.0);
  // A restarted worker arriving again at generation 0 passes at once.
  Answer<v1::BarrierResponse> restarted;
  Arrive("init", v1::ROLE_WORKER, 0, 0, &restarted);
  ASSERT_TRUE(restarted.done());
  EXPECT_TRUE(restarted.status().ok());
  // Generation 1 waits again; generation 2 is ahead of the scheduler.
  Answer<v1::BarrierResponse> g1, ahead;
  Arrive("init", v1::ROLE_WORKER, 1, 1, &g1);
  EXPECT_FALSE(g1.done());
  Arrive("init", v1::ROLE_WORKER, 0, 2, &ahead);
  ASSERT_TRUE(ahead.done());
  EXPECT_EQ(ahead.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(ahead.status().message(), HasSubstr("generation 2 is ahead"));
  // Names are independent.
  Answer<v1::BarrierResponse> other;
  Arrive("other", v1::ROLE_WORKER, 0, 0, &other);
  EXPECT_FALSE(other.done());
  // At the deadline, the waiters learn whom they waited for.
  clock_.Advance(31s);
  state_->Sweep();
  ASSERT_TRUE(g1.done() && other.done());
  EXPECT_EQ(g1.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(g1.status().message(),
            "barrier \"init\" generation 1: 1 of 2 arrived; waiting for worker 0");
}

TEST_F(SchedulerStateTest, AllNodesBarrierWaitsForServersToo) {
  Boot(1, 1);
  Answer<v1::BarrierResponse> w, s, wrong;
  Arrive("start", v1::ROLE_WORKER, 0, 0, &w, true);
  EXPECT_FALSE(w.done());
  Arrive("start", v1::ROLE_SERVER, 0, 0, &s, true);
  ASSERT_TRUE(w.done() && s.done());
  EXPECT_TRUE(w.status().ok());
  // A server may not join a workers-only barrier; all_nodes must agree per name.
  Arrive("workers", v1::ROLE_SERVER, 0, 0, &wrong);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  Answer<v1::BarrierResponse> mixed;
  Arrive("start", v1::ROLE_WORKER, 0, 1, &mixed, false);
  EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
}

TEST_F(SchedulerStateTest, SilentNodesAreMarkedDeadOnceAndRevived) {
  Boot(1, 2);
  clock_.Advance(6s);
  ASSERT_TRUE(Beat(v1::ROLE_WORKER, 0).ok());
  ASSERT_TRUE(Beat(v1::ROLE_SERVER, 0).ok());
  clock_.Advance(5s);  // worker 1 silent for 11 s, the others for 5 s
  const int64_t before = state_->GetCluster().version();
  state_->Sweep();
  auto v = state_->GetCluster();
  EXPECT_GT(v.version(), before);
  EXPECT_TRUE(v.workers(1).dead());
  EXPECT_FALSE(v.workers(0).dead());
  EXPECT_FALSE(v.servers(0).dead());
  EXPECT_EQ(state_->stats().dead_detected, 1);
  state_->Sweep();  // counted once
  EXPECT_EQ(state_->stats().dead_detected, 1);
  auto hb = Beat(v1::ROLE_WORKER, 0);
  ASSERT_TRUE(hb.ok());
  ASSERT_EQ(hb->dead_size(), 1);
  EXPECT_EQ(hb->dead(0).rank(), 1);
  EXPECT_EQ(hb->dead(0).pod_name(), "w1");
  // A heartbeat revives it.
  ASSERT_TRUE(Beat(v1::ROLE_WORKER, 1).ok());
  EXPECT_FALSE(state_->GetCluster().workers(1).dead());
  EXPECT_EQ(Beat(v1::ROLE_WORKER, 0)->dead_size(), 0);
  // Exited nodes are never declared dead.
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0, false).ok());
  clock_.Advance(60s);
  state_->Sweep();
  EXPECT_FALSE(state_->GetCluster().workers(1).dead());
  EXPECT_TRUE(state_->GetCluster().workers(0).dead());
}

TEST_F(SchedulerStateTest, WorkerFailureFailsTheJobAndWakesEveryWaiter) {
  Make(1, 3);
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "mlp-server-0").ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Reg(v1::ROLE_WORKER, "mlp-worker-" + std::to_string(i)).ok());
  Answer<std::shared_ptr<const v1::ClusterView>> view;
  v1::GetClusterRequest wc;
  wc.set_wait_complete(true);  // never completes: the server is not ready
  state_->WaitCluster(wc, clock_.Now() + 60s, view.Cb());
  Answer<std::shared_ptr<const v1::ShardMap>> keys;
  Declare(0, {Key(1, 4)}, &keys);
  Answer<v1::BarrierResponse> barrier;
  Arrive("b", v1::ROLE_WORKER, 2, 0, &barrier);
  ASSERT_FALSE(view.done() || keys.done() || barrier.done());

  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 137, false).ok());
  const std::string want = "worker 1 (pod mlp-worker-1) failed: exit code 137 (killed by SIGKILL)";
  ASSERT_TRUE(view.done() && keys.done() && barrier.done());
  EXPECT_TRUE(view.got->value()->failed());
  EXPECT_EQ(view.got->value()->failure_message(), want);
  EXPECT_EQ(keys.status().code(), StatusCode::kAborted);
  EXPECT_EQ(keys.status().message(), "job failed: " + want);
  EXPECT_EQ(barrier.status().message(), "job failed: " + want);
  auto hb = Beat(v1::ROLE_WORKER, 0);
  ASSERT_TRUE(hb.ok());
  EXPECT_TRUE(hb->job_failed());
  EXPECT_EQ(hb->failure_message(), want);
  // Later waits fail at once instead of hanging.
  Answer<v1::BarrierResponse> late;
  Arrive("b", v1::ROLE_WORKER, 0, 0, &late);
  ASSERT_TRUE(late.done());
  EXPECT_EQ(late.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(state_->GetCluster().workers(1).exited());
}

TEST_F(SchedulerStateTest, ExitsThatDoNotFailTheJob) {
  Boot(1, 2);
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 1, true).ok());     // will restart
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0, false).ok());    // finished
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, 143, false).ok());  // servers end by SIGTERM
  EXPECT_FALSE(state_->GetCluster().failed());
  EXPECT_EQ(DescribeExitCode(1), "exit code 1");
  EXPECT_EQ(DescribeExitCode(139), "exit code 139 (killed by SIGSEGV)");
  v1::LeaveRequest leave;
  leave.set_role(v1::ROLE_WORKER);
  leave.set_rank(0);
  ASSERT_TRUE(state_->Leave(leave).ok());
  EXPECT_TRUE(state_->GetCluster().workers(0).exited());
  leave.set_rank(-1);
  EXPECT_EQ(state_->Leave(leave).code(), StatusCode::kInvalidArgument);
}

TEST_F(SchedulerStateTest, ShutdownAnswersWaiters) {
  Boot(1, 2);
  Answer<v1::BarrierResponse> b;
  Arrive("x", v1::ROLE_WORKER, 0, 0, &b);
  state_->Shutdown();
  ASSERT_TRUE(b.done());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  Answer<v1::BarrierResponse> after;
  Arrive("x", v1::ROLE_WORKER, 1, 0, &after);
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// The scheduler's /metrics series follow the state: nodes, dead nodes, restarts by role,
// barrier releases and waits.
TEST_F(SchedulerStateTest, MetricsFollowTheState) {
  Boot(1, 2);
  MetricsRegistry registry(MetricLabels{"mlp", "scheduler", -1});
  RegisterSchedulerMetrics(registry, *state_);
  auto has = [&](const std::string& series) { return registry.Serialize().find(series) != std::string::npos; };
  EXPECT_TRUE(has("trellis_scheduler_nodes{job=\"mlp\",role=\"scheduler\",node_role=\"worker\"} 2"));
  EXPECT_TRUE(has("trellis_scheduler_nodes{job=\"mlp\",role=\"scheduler\",node_role=\"server\"} 1"));
  EXPECT_TRUE(has("trellis_scheduler_dead_nodes{job=\"mlp\",role=\"scheduler\",node_role=\"worker\"} 0"));

  Answer<v1::BarrierResponse> a0, a1;
  Arrive("b", v1::ROLE_WORKER, 0, 0, &a0);
  clock_.Advance(2s);
  Arrive("b", v1::ROLE_WORKER, 1, 0, &a1);
  ASSERT_TRUE(a0.done() && a1.done());
  EXPECT_TRUE(has("trellis_scheduler_barrier_releases_total{job=\"mlp\",role=\"scheduler\"} 1"));
  EXPECT_TRUE(has("trellis_scheduler_barrier_wait_seconds_total{job=\"mlp\",role=\"scheduler\"} 2"));

  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 1, /*will_restart=*/true).ok());
  EXPECT_TRUE(has("trellis_scheduler_restarts_total{job=\"mlp\",role=\"scheduler\",node_role=\"worker\"} 1"));
  EXPECT_TRUE(has("trellis_scheduler_restarts_total{job=\"mlp\",role=\"scheduler\",node_role=\"server\"} 0"));

  clock_.Advance(11s);  // everyone silent past the heartbeat timeout
  state_->Sweep();
  EXPECT_TRUE(has("trellis_scheduler_dead_nodes{job=\"mlp\",role=\"scheduler\",node_role=\"server\"} 1"));
  EXPECT_TRUE(has("trellis_scheduler_dead_nodes{job=\"mlp\",role=\"scheduler\",node_role=\"worker\"} 2"));
  EXPECT_TRUE(has("trellis_scheduler_dead_detected_total{job=\"mlp\",role=\"scheduler\"} 3"))
      << registry.Serialize();
  EXPECT_TRUE(registry.errors().empty());
}

}  // namespace
}  // namespace trellis
