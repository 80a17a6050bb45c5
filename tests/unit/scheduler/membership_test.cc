// Membership on its own (no SchedulerState, no lock): ranks, reports, adoption after a scheduler
// restart, and liveness. The facade's behaviour is covered by scheduler_state_test and friends.
#include "scheduler/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

class MembershipTest : public ::testing::Test {
 protected:
  MembershipTest() {
    config_.num_servers = 2;
    config_.num_workers = 3;
    config_.heartbeat_timeout = 10s;
    config_.replacement_timeout = 60s;
    config_.liveness_timeout = 0s;
    config_.progress_timeout = 0s;
  }
  static v1::RegisterRequest Req(v1::Role role, const std::string& pod) {
    v1::RegisterRequest r;
    r.set_role(role);
    r.set_pod_name(pod);
    return r;
  }

  SchedulerConfig config_;
  ManualClock clock_;
};

TEST_F(MembershipTest, RanksFollowPodOrdinalsThenArrival) {
  Membership m(config_, &clock_);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "job-worker-2")), 2);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "other")), 0);
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "job-worker-0")), 1);  // 0 taken: lowest free
  auto more = m.Register(Req(v1::ROLE_WORKER, "job-worker-3"));
  EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted);
  // The same pod again: its rank, next incarnation.
  EXPECT_EQ(*m.Register(Req(v1::ROLE_WORKER, "other")), 0);
  EXPECT_EQ(m.at(v1::ROLE_WORKER, 0).incarnation, 2);
  EXPECT_EQ(m.at(v1::ROLE_WORKER, 0).restarts, 1);
  // Another role under a registered pod name.
  EXPECT_EQ(m.Register(Req(v1::ROLE_SERVER, "other")).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(MembershipTest, CompleteOnceEveryoneRegisteredAndServersReady) {
  Membership m(config_, &clock_);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(m.Register(Req(v1::ROLE_SERVER, "s-" + std::to_string(i))).ok());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "w-" + std::to_string(i))).ok());
  EXPECT_TRUE(m.AllRegistered());
  EXPECT_FALSE(m.Complete());
  for (int i = 0; i < 2; ++i) {
    v1::ReportReadyRequest r;
    r.set_role(v1::ROLE_SERVER);
    r.set_rank(i);
    r.set_address("10.0.0.1:700" + std::to_string(i));
    ASSERT_TRUE(m.Ready(r).ok());
  }
  EXPECT_TRUE(m.Complete());
  v1::ClusterView view;
  m.FillView(&view);
  EXPECT_EQ(view.servers_size(), 2);
  EXPECT_EQ(view.workers_size(), 3);
  EXPECT_EQ(view.servers(1).address(), "10.0.0.1:7001");
}

TEST_F(MembershipTest, AdoptionAfterARestartAndMissingMembersMarkedDead) {
  Membership m(config_, &clock_);
  v1::RegisterRequest back = Req(v1::ROLE_WORKER, "w-a");
  back.set_previous_rank(1);
  back.set_previous_incarnation(4);
  back.set_resume(true);
  ASSERT_FALSE(m.Known("w-a"));
  ASSERT_TRUE(m.CheckAdoptable(back).ok());
  EXPECT_EQ(m.Adopt(back), 1);
  EXPECT_EQ(m.at(v1::ROLE_WORKER, 1).incarnation, 4);  // resumed: the same program runs on
  // Another pod claiming the rank is refused.
  v1::RegisterRequest thief = back;
  thief.set_pod_name("w-b");
  EXPECT_EQ(m.CheckAdoptable(thief).code(), StatusCode::kFailedPrecondition);
  std::string names;
  EXPECT_EQ(m.MarkMissingDead(clock_.Now(), &names), 4);
  EXPECT_THAT(names, HasSubstr("server 0"));
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 0).dead);
  EXPECT_FALSE(m.Live(v1::ROLE_WORKER, 0));
  EXPECT_TRUE(m.Live(v1::ROLE_WORKER, 1));
  // A new pod takes an orphaned rank (registered after the grace, no pod name).
  auto orphan = m.Register(Req(v1::ROLE_WORKER, "job-worker-2"));
  ASSERT_TRUE(orphan.ok());
  EXPECT_EQ(*orphan, 2);
  EXPECT_FALSE(m.at(v1::ROLE_WORKER, 2).dead);
}

TEST_F(MembershipTest, SilentMembersDieAndPreemptedOnesFailTheJobLate) {
  Membership m(config_, &clock_);
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "w-0")).ok());
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "w-1")).ok());
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(1);
  exit.set_exit_code(143);
  exit.set_preempted(true);
  std::string failure;
  ASSERT_TRUE(m.ReportExit(exit, &failure).ok());
  EXPECT_TRUE(failure.empty());
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 1).preempted);

  clock_.Advance(11s);
  bool changed = false;
  std::vector<Membership::Loss> failures;
  m.SweepLiveness(clock_.Now(), &changed, &failures);
  EXPECT_TRUE(changed);
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 0).dead);
  EXPECT_FALSE(m.at(v1::ROLE_WORKER, 1).dead);  // away, on its own deadline
  EXPECT_TRUE(failures.empty());

  clock_.Advance(60s);
  m.SweepLiveness(clock_.Now(), &changed, &failures);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0].role, v1::ROLE_WORKER);
  EXPECT_EQ(failures[0].rank, 1);
  EXPECT_THAT(failures[0].why, HasSubstr("worker 1 (pod w-1) was stopped from outside"));
}

TEST_F(MembershipTest, AnElasticJobsWorkerSilentPastTheRegistrationTimeoutIsLost) {
  config_.elastic = {true, 1, 3};
  Membership m(config_, &clock_);
  for (const char* pod : {"w-0", "w-1", "w-2"}) ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, pod)).ok());
  auto beat = [&](int32_t rank) {
    v1::HeartbeatRequest hb;
    hb.set_role(v1::ROLE_WORKER);
    hb.set_rank(rank);
    v1::HeartbeatResponse resp;
    bool revived = false;
    ASSERT_TRUE(m.Heartbeat(hb, &resp, &revived).ok());
  };
  bool changed = false;
  std::vector<Membership::Loss> losses;
  for (int i = 0; i < 3; ++i) {  // workers 0 and 2 heartbeat, worker 1 is silent
    clock_.Advance(5s);
    beat(0);
    beat(2);
    m.SweepLiveness(clock_.Now(), &changed, &losses);
  }
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 1).dead);
  EXPECT_TRUE(losses.empty());
  // Dead but not lost yet: the others wait for it as for one restarting.
  v1::PingResponse ping;
  m.FillRestarting(&ping);
  EXPECT_THAT(ping.restarting_workers(), ::testing::ElementsAre(1));

  for (int i = 0; i < 10 && losses.empty(); ++i) {  // 60 s after its last heartbeat
    clock_.Advance(5s);
    beat(0);
    beat(2);
    m.SweepLiveness(clock_.Now(), &changed, &losses);
  }
  ASSERT_EQ(losses.size(), 1u);
  EXPECT_EQ(losses[0].role, v1::ROLE_WORKER);
  EXPECT_EQ(losses[0].rank, 1);
  EXPECT_THAT(losses[0].why, HasSubstr("worker 1 (pod w-1) was silent for 6"));
  EXPECT_THAT(losses[0].why, HasSubstr("registrationTimeoutSeconds (60.0 s)"));
  EXPECT_TRUE(losses[0].silent);  // its processes may still be there: someone must stop them
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 1).exited);
  v1::PingResponse after;
  m.FillRestarting(&after);
  EXPECT_TRUE(after.restarting_workers().empty());  // nobody waits for it any more
  // Lost once, not again on every sweep.
  losses.clear();
  clock_.Advance(60s);
  beat(0);
  beat(2);
  m.SweepLiveness(clock_.Now(), &changed, &losses);
  EXPECT_TRUE(losses.empty());
}

TEST_F(MembershipTest, WithoutSpecElasticASilentWorkerIsOnlyDead) {
  Membership m(config_, &clock_);
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "w-0")).ok());
  bool changed = false;
  std::vector<Membership::Loss> losses;
  clock_.Advance(600s);
  m.SweepLiveness(clock_.Now(), &changed, &losses);
  EXPECT_TRUE(m.at(v1::ROLE_WORKER, 0).dead);
  EXPECT_FALSE(m.at(v1::ROLE_WORKER, 0).exited);
  EXPECT_TRUE(losses.empty());  // a heartbeat may still revive it, as before
  v1::PingResponse ping;
  m.FillRestarting(&ping);
  EXPECT_TRUE(ping.restarting_workers().empty());
}

TEST_F(MembershipTest, AWorkerFailingForGoodIsTheJobsFailure) {
  Membership m(config_, &clock_);
  ASSERT_TRUE(m.Register(Req(v1::ROLE_WORKER, "w-0")).ok());
  v1::ReportExitRequest exit;
  exit.set_role(v1::ROLE_WORKER);
  exit.set_rank(0);
  exit.set_exit_code(137);
  exit.set_message("out of memory");
  std::string failure;
  ASSERT_TRUE(m.ReportExit(exit, &failure).ok());
  EXPECT_EQ(failure, "worker 0 (pod w-0) failed: exit code 137 (killed by SIGKILL): out of memory");
}

}  // namespace
}  // namespace trellis
