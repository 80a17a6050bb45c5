// A pod deleted or evicted while the job runs (docs/kubernetes.md "What survives a pod
// deletion"): its agent reports the exit as preempted, the scheduler keeps the rank for the
// replacement pod instead of failing the job, and fails it only when no replacement registers
// within the replacement timeout.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>

#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/running_job_fixture.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class PreemptionTest : public testing::RunningJobTest {
 protected:
  Status Exit(v1::Role role, int32_t rank, int32_t code, bool preempted) {
    v1::ReportExitRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_exit_code(code);
    r.set_preempted(preempted);
    r.set_message("program exited with code " + std::to_string(code));
    return state_->ReportExit(r);
  }
  // Member (role, rank)'s agent asks whether its program runs on; rank 0 writes exit
  // checkpoints (`ready`), and has written one (`written`).
  v1::PodStoppingResponse Stopping(v1::Role role, int32_t rank, bool ready = true, bool written = false) {
    v1::PodStoppingRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_incarnation(1);
    auto got = state_->PodStopping(r, ready, written);
    EXPECT_TRUE(got.ok()) << got.status().ToString();
    return got.ok() ? *got : v1::PodStoppingResponse();
  }
  void Watch(int32_t rank, int64_t incarnation) {
    v1::WatchRejoinsRequest w;
    w.set_rank(rank);
    w.set_incarnation(incarnation);
    std::optional<StatusOr<v1::WatchRejoinsResponse>> got;
    state_->WatchRejoins(w, clock_.Now() + 10s, [&](StatusOr<v1::WatchRejoinsResponse> r) { got = r; });
    ASSERT_TRUE(got.has_value() && got->ok());
  }
};

// Pods stopped from outside (scheduler/pod_stops.h): one pod alone waits a moment for the others
// and then stops (its replacement rejoins); once every worker's pod is going, the whole job
// stops and everyone waits for rank 0's exit checkpoint, within the job's stop limit.
TEST_F(PreemptionTest, EveryWorkersPodStoppingStopsTheWholeJobAndEveryoneWaitsForTheExitCheckpoint) {
  // One worker's pod: it waits the window (2 s) for the others, then stops; the job goes on.
  EXPECT_TRUE(Stopping(v1::ROLE_WORKER, 1).wait());
  clock_.Advance(1s);
  EXPECT_TRUE(Stopping(v1::ROLE_SERVER, 0).wait());
  clock_.Advance(1500ms);
  auto alone = Stopping(v1::ROLE_WORKER, 1);
  EXPECT_FALSE(alone.wait());
  EXPECT_THAT(alone.reason(), HasSubstr("only some of the job's pods"));
  EXPECT_EQ(state_->stop_reason(), "");
  // Worker 0's pod too: every worker's is going, so the whole job stops.
  auto all = Stopping(v1::ROLE_WORKER, 0);
  EXPECT_TRUE(all.wait());
  EXPECT_THAT(all.reason(), HasSubstr("every worker's pod is being stopped"));
  EXPECT_THAT(state_->stop_reason(), HasSubstr("every worker's pod is being stopped from outside"));
  EXPECT_TRUE(Stopping(v1::ROLE_WORKER, 1).wait()) << "everyone waits now";
  // Replacement pods that start meanwhile wait for the next scheduler.
  EXPECT_EQ(Reg(v1::ROLE_WORKER, "mlp-worker-1").status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Stopping(v1::ROLE_SERVER, 0).wait());
  // Rank 0 wrote it: everyone stops.
  auto done = Stopping(v1::ROLE_SERVER, 1, true, /*written=*/true);
  EXPECT_FALSE(done.wait());
  EXPECT_THAT(done.reason(), HasSubstr("exit checkpoint is written"));
}

TEST_F(PreemptionTest, NobodyWaitsLongerThanTheStopLimitOrForARankZeroWithoutACheckpointer) {
  auto none = Stopping(v1::ROLE_WORKER, 0, /*ready=*/false);
  EXPECT_FALSE(none.wait());
  EXPECT_THAT(none.reason(), HasSubstr("writes no exit checkpoint"));
  state_->StopJob("suspended");
  EXPECT_TRUE(Stopping(v1::ROLE_WORKER, 1).wait());
  clock_.Advance(26s);
  EXPECT_TRUE(Stopping(v1::ROLE_WORKER, 1).wait());
  clock_.Advance(1s);  // the default stop limit: 27 s
  auto late = Stopping(v1::ROLE_WORKER, 1);
  EXPECT_FALSE(late.wait());
  EXPECT_THAT(late.reason(), HasSubstr("no exit checkpoint within 27 s"));
}

TEST_F(PreemptionTest, PodsStoppedAfterAWorkerFinishedDoNotWaitAndUnknownMembersAreRefused) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 0, /*preempted=*/false).ok());
  auto end = Stopping(v1::ROLE_SERVER, 0);
  EXPECT_FALSE(end.wait()) << "the job is ending: servers stopped at the end wait for nothing";
  EXPECT_THAT(end.reason(), HasSubstr("workers have finished"));
  v1::PodStoppingRequest bad;
  bad.set_role(v1::ROLE_WORKER);
  bad.set_rank(7);
  EXPECT_EQ(state_->PodStopping(bad, true, false).status().code(), StatusCode::kInvalidArgument);
  bad.set_role(v1::ROLE_UNSPECIFIED);
  bad.set_rank(0);
  EXPECT_EQ(state_->PodStopping(bad, true, false).status().code(), StatusCode::kInvalidArgument);
}

// A worker pod deleted in the job's last moments, whose program finished meanwhile, is
// recreated by the operator: its new agent learns there is nothing left to run.
TEST_F(PreemptionTest, APodRecreatedAfterItsWorkerFinishedIsToldItHasNothingToRun) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0, /*preempted=*/false).ok());
  auto again = Reg(v1::ROLE_WORKER, "mlp-worker-1");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->finished());
  EXPECT_EQ(again->rank(), 1);
  EXPECT_EQ(again->incarnation(), 1) << "nothing restarts";
  EXPECT_TRUE(state_->GetCluster().workers(1).exited());
  // A worker that failed is no such case: it registers as a restart.
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 3, /*preempted=*/true).ok());
  auto restarted = Reg(v1::ROLE_WORKER, "mlp-worker-0");
  ASSERT_TRUE(restarted.ok());
  EXPECT_FALSE(restarted->finished());
  EXPECT_EQ(restarted->incarnation(), 2);
}

TEST_F(PreemptionTest, APreemptedWorkerDoesNotFailTheJobAndItsReplacementGetsTheRank) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 143, /*preempted=*/true).ok());
  auto view = state_->GetCluster();
  EXPECT_FALSE(view.failed()) << view.failure_message();
  EXPECT_TRUE(view.workers(1).preempted());
  EXPECT_FALSE(view.workers(1).exited());
  // Away for a known reason: not marked dead by the heartbeat sweep.
  clock_.Advance(30s);
  state_->Sweep();
  view = state_->GetCluster();
  EXPECT_FALSE(view.workers(1).dead());
  EXPECT_FALSE(view.failed());

  // The replacement pod has the same name: same rank, the next incarnation, a restart counted.
  auto again = Reg(v1::ROLE_WORKER, "mlp-worker-1");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->rank(), 1);
  EXPECT_EQ(again->incarnation(), 2);
  view = state_->GetCluster();
  EXPECT_FALSE(view.workers(1).preempted());
  EXPECT_EQ(view.workers(1).restarts(), 1);
  // Its deadline is gone with it.
  clock_.Advance(120s);
  state_->Sweep();
  EXPECT_FALSE(state_->GetCluster().failed());
}

TEST_F(PreemptionTest, APreemptedServerKeepsItsRankToo) {
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 0, /*preempted=*/true).ok());
  auto view = state_->GetCluster();
  EXPECT_TRUE(view.servers(1).preempted());
  EXPECT_FALSE(view.servers(1).ready());  // workers wait for the replacement's new address
  auto again = Reg(v1::ROLE_SERVER, "mlp-server-1");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank(), 1);
  EXPECT_EQ(again->incarnation(), 2);
  EXPECT_FALSE(state_->GetCluster().failed());
}

TEST_F(PreemptionTest, AStopAfterEveryWorkerFinishedIsTheEndOfTheRun) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 0, false).ok());
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 0, false).ok());
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, 0, /*preempted=*/true).ok());  // the clean-up's SIGTERM
  auto view = state_->GetCluster();
  EXPECT_FALSE(view.servers(0).preempted());
  EXPECT_TRUE(view.servers(0).exited());
  clock_.Advance(120s);
  state_->Sweep();
  EXPECT_FALSE(state_->GetCluster().failed());
}

TEST_F(PreemptionTest, NoReplacementWithinTheTimeoutFailsTheJobNamingThePod) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 1, 143, /*preempted=*/true).ok());
  clock_.Advance(59s);
  state_->Sweep();
  ASSERT_FALSE(state_->GetCluster().failed());
  clock_.Advance(2s);
  state_->Sweep();
  auto view = state_->GetCluster();
  ASSERT_TRUE(view.failed());
  EXPECT_THAT(view.failure_message(), HasSubstr("worker 1 (pod mlp-worker-1) was stopped from outside"));
  EXPECT_THAT(view.failure_message(), HasSubstr("no replacement pod registered within 60 s"));
}

TEST_F(PreemptionTest, AStopUnderNeverIsAFailureWithTheAgentsMessage) {
  v1::ReportExitRequest r;
  r.set_role(v1::ROLE_WORKER);
  r.set_rank(0);
  r.set_exit_code(143);
  r.set_message("program exited with code 143 after the agent got SIGTERM (the pod was deleted, "
                "evicted or drained); restartPolicy Never does not replace it");
  ASSERT_TRUE(state_->ReportExit(r).ok());
  auto view = state_->GetCluster();
  ASSERT_TRUE(view.failed());
  EXPECT_THAT(view.failure_message(), HasSubstr("worker 0 (pod mlp-worker-0) failed"));
  EXPECT_THAT(view.failure_message(), HasSubstr("the pod was deleted"));
}

TEST_F(PreemptionTest, APreemptedWorkerIsNoRejoinDonor) {
  // Both workers committed and watch; worker 0, the usual donor, is deleted. Worker 1's own
  // restart must get a live donor, not the pod that is gone: none here, and training began, so
  // nobody holds the model: the job fails at once...
  Watch(0, 1);
  Watch(1, 1);
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 143, /*preempted=*/true).ok());
  ASSERT_TRUE(Reg(v1::ROLE_WORKER, "mlp-worker-1").ok());  // worker 1 restarted: incarnation 2
  v1::RequestRejoinRequest rq;
  rq.set_rank(1);
  rq.set_incarnation(2);
  std::optional<StatusOr<v1::RequestRejoinResponse>> got;
  state_->RequestRejoin(rq, clock_.Now() + 10s, [&](StatusOr<v1::RequestRejoinResponse> r) { got = r; });
  ASSERT_TRUE(got.has_value()) << "no answer";
  EXPECT_EQ(got->status().code(), StatusCode::kAborted);  // ...instead of waiting on the deleted pod
  EXPECT_THAT(got->status().message(), HasSubstr("every worker that held the model is gone"));
  EXPECT_TRUE(state_->GetCluster().failed());
}

}  // namespace
}  // namespace trellis
