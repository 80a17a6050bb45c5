// Stall detection (docs/scheduler.md#stalls): a program whose own pings stop while its agent
// heartbeats on, or a worker whose step stands still while another waits for it, is named
// stalled, its agent is told to restart it, and the members waiting on it are told it is being
// restarted until its new program reports.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/running_job_fixture.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class StallTest : public testing::RunningJobTest {
 protected:
  void Configure(SchedulerConfig& c) override {
    c.liveness_timeout = 3s;
    c.progress_timeout = 20s;
  }
  v1::PingResponse Ping(v1::Role role, int32_t rank, int64_t incarnation = 1) {
    v1::PingRequest p;
    p.set_role(role);
    p.set_rank(rank);
    p.set_incarnation(incarnation);
    return state_->Ping(p);
  }
  // Every agent heartbeats; returns the answer to `role` `rank`'s agent.
  v1::HeartbeatResponse Beat(v1::Role role, int32_t rank, int64_t incarnation = 1) {
    v1::HeartbeatRequest h;
    h.set_role(role);
    h.set_rank(rank);
    h.set_incarnation(incarnation);
    auto r = state_->Heartbeat(h);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : v1::HeartbeatResponse();
  }
  // One second passes: every agent beats, the programs in `live` ping (role, rank), a sweep.
  void Second(const std::vector<std::pair<v1::Role, int32_t>>& live) {
    clock_.Advance(1s);
    for (int r = 0; r < 2; ++r) {
      Beat(v1::ROLE_SERVER, r, state_->GetCluster().servers(r).incarnation());
      Beat(v1::ROLE_WORKER, r, state_->GetCluster().workers(r).incarnation());
    }
    for (const auto& [role, rank] : live) {
      const auto& v = state_->GetCluster();
      Ping(role, rank, (role == v1::ROLE_SERVER ? v.servers(rank) : v.workers(rank)).incarnation());
    }
    state_->Sweep();
  }
  static std::vector<std::pair<v1::Role, int32_t>> All() {
    return {{v1::ROLE_SERVER, 0}, {v1::ROLE_SERVER, 1}, {v1::ROLE_WORKER, 0}, {v1::ROLE_WORKER, 1}};
  }
  static std::vector<std::pair<v1::Role, int32_t>> AllBut(v1::Role role, int32_t rank) {
    auto all = All();
    std::erase(all, std::make_pair(role, rank));
    return all;
  }
};

TEST_F(StallTest, ASilentServerProgramIsStalledWhileItsAgentLivesAndIsRestartedByIt) {
  for (int i = 0; i < 5; ++i) Second(All());
  EXPECT_FALSE(state_->GetCluster().servers(1).stalled());
  EXPECT_FALSE(Beat(v1::ROLE_SERVER, 1).restart_program());

  // Server 1's program stops (SIGSTOP): its agent beats on, so it is not dead; after the
  // liveness timeout it is stalled, named with why.
  for (int i = 0; i < 3; ++i) Second(AllBut(v1::ROLE_SERVER, 1));
  EXPECT_FALSE(state_->GetCluster().servers(1).stalled()) << "3 s is the bound, not yet past it";
  Second(AllBut(v1::ROLE_SERVER, 1));
  auto view = state_->GetCluster();
  ASSERT_TRUE(view.servers(1).stalled());
  EXPECT_FALSE(view.servers(1).dead());
  EXPECT_TRUE(view.servers(1).restarting());
  EXPECT_THAT(view.servers(1).stall_reason(),
              HasSubstr("its program sent no liveness for 4.0 s (livenessTimeoutSeconds 3.0)"));
  EXPECT_FALSE(view.servers(0).stalled());
  EXPECT_FALSE(view.failed());
  EXPECT_EQ(state_->stats().stalls, 1);

  // Its agent is told to restart it; the others' agents are not. The members waiting on it
  // learn that it is being restarted.
  auto beat = Beat(v1::ROLE_SERVER, 1);
  EXPECT_TRUE(beat.restart_program());
  EXPECT_THAT(beat.restart_reason(), HasSubstr("no liveness"));
  EXPECT_FALSE(Beat(v1::ROLE_SERVER, 0).restart_program());
  EXPECT_THAT(Ping(v1::ROLE_WORKER, 0).restarting_servers(), ElementsAre(1));

  // The agent kills it and restarts it: the exit report, a new incarnation. Still restarting
  // (the others keep waiting) until the new program reports; then back, and judged afresh.
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_SERVER);
  exit.set_rank(1);
  exit.set_incarnation(1);
  exit.set_exit_code(137);
  exit.set_will_restart(true);
  ASSERT_TRUE(state_->ReportExit(exit).ok());
  EXPECT_FALSE(state_->GetCluster().servers(1).stalled());
  EXPECT_FALSE(Beat(v1::ROLE_SERVER, 1).restart_program());
  ASSERT_EQ(Reg(v1::ROLE_SERVER, "mlp-server-1")->incarnation(), 2);
  for (int i = 0; i < 5; ++i) Second(AllBut(v1::ROLE_SERVER, 1));  // starting: not judged
  EXPECT_FALSE(state_->GetCluster().servers(1).stalled());
  EXPECT_THAT(Ping(v1::ROLE_WORKER, 0).restarting_servers(), ElementsAre(1));
  EXPECT_THAT(Ping(v1::ROLE_SERVER, 1, /*incarnation=*/1).restarting_servers(), ElementsAre(1))
      << "a ping of the killed incarnation is not the new program";
  Ping(v1::ROLE_SERVER, 1, 2);
  view = state_->GetCluster();
  EXPECT_FALSE(view.servers(1).restarting());
  EXPECT_THAT(Ping(v1::ROLE_WORKER, 0).restarting_servers(), IsEmpty());
  for (int i = 0; i < 5; ++i) Second(All());
  EXPECT_FALSE(state_->GetCluster().servers(1).stalled());
  EXPECT_FALSE(state_->GetCluster().failed());
}

TEST_F(StallTest, AStalledWorkerUnderNeverFailsTheJobNamingIt) {
  for (int i = 0; i < 2; ++i) Second(All());
  for (int i = 0; i < 4; ++i) Second(AllBut(v1::ROLE_WORKER, 0));
  ASSERT_TRUE(state_->GetCluster().workers(0).stalled());
  // restartPolicy Never: the agent kills it and reports a final exit, which fails the job.
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(0);
  exit.set_incarnation(1);
  exit.set_exit_code(137);
  exit.set_message("program killed by SIGKILL (code 137) after it stalled (...)");
  ASSERT_TRUE(state_->ReportExit(exit).ok());
  auto view = state_->GetCluster();
  EXPECT_TRUE(view.failed());
  EXPECT_THAT(view.failure_message(), HasSubstr("worker 0 (pod mlp-worker-0) failed"));
  EXPECT_THAT(view.failure_message(), HasSubstr("after it stalled"));
  EXPECT_THAT(Ping(v1::ROLE_WORKER, 1).restarting_workers(), IsEmpty());
}

TEST_F(StallTest, ProgramsThatNeverPingAreNotJudged) {
  // Older programs (anonymous pings) and programs still starting: only the agent counts.
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(1s);
    for (int r = 0; r < 2; ++r) {
      Beat(v1::ROLE_SERVER, r);
      Beat(v1::ROLE_WORKER, r);
    }
    state_->Ping(v1::PingRequest());
    state_->Sweep();
  }
  auto view = state_->GetCluster();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(view.servers(r).stalled());
    EXPECT_FALSE(view.workers(r).stalled());
  }
  EXPECT_EQ(state_->stats().stalls, 0);
}

TEST_F(StallTest, AWorkerWhoseStepStandsStillWhileAnotherWaitsIsStalled) {
  // Both ping (their library's thread lives), but worker 1's training loop is stuck at step 7
  // while worker 0 reached step 8 and waits for worker 1's pushes.
  state_->ProgramProgress(0, 1, 7);
  state_->ProgramProgress(1, 1, 7);
  for (int i = 0; i < 2; ++i) Second(All());
  state_->ProgramProgress(0, 1, 8);
  for (int i = 0; i < 18; ++i) Second(All());
  EXPECT_FALSE(state_->GetCluster().workers(1).stalled()) << "20 s is the bound";
  Second(All());
  auto view = state_->GetCluster();
  ASSERT_TRUE(view.workers(1).stalled());
  EXPECT_FALSE(view.workers(0).stalled()) << "the waiting worker is not the stalled one";
  EXPECT_THAT(view.workers(1).stall_reason(),
              HasSubstr("its step 7 has not advanced for 21.0 s while worker 0 is at step 8"));
}

TEST_F(StallTest, WorkersAtTheSameStepAreNotStalledByTheProgressCheck) {
  // Everyone waits on something else (a slow server, the end of the run): no worker is ahead.
  state_->ProgramProgress(0, 1, 9);
  state_->ProgramProgress(1, 1, 9);
  for (int i = 0; i < 40; ++i) Second(All());
  auto view = state_->GetCluster();
  EXPECT_FALSE(view.workers(0).stalled());
  EXPECT_FALSE(view.workers(1).stalled());
}

TEST_F(StallTest, ARestartThatNeverComesBackFailsTheJobInsteadOfWaitingForever) {
  for (int i = 0; i < 2; ++i) Second(All());
  for (int i = 0; i < 4; ++i) Second(AllBut(v1::ROLE_SERVER, 0));
  ASSERT_TRUE(state_->GetCluster().servers(0).restarting());
  // The agent never acts (or the new program never reports): bounded by the replacement timeout.
  for (int i = 0; i < 58; ++i) Second(AllBut(v1::ROLE_SERVER, 0));
  EXPECT_FALSE(state_->GetCluster().failed());
  for (int i = 0; i < 3; ++i) Second(AllBut(v1::ROLE_SERVER, 0));
  auto view = state_->GetCluster();
  EXPECT_TRUE(view.failed());
  EXPECT_THAT(view.failure_message(),
              HasSubstr("server 0 (pod mlp-server-0) stalled (its program sent no liveness"));
  EXPECT_THAT(view.failure_message(), HasSubstr("did not come back within 60 s"));
  EXPECT_THAT(Ping(v1::ROLE_WORKER, 0).restarting_servers(), IsEmpty());
}

}  // namespace
}  // namespace trellis
