// A server lost for good in a job with elastic servers (docs/elastic.md#losing-a-server): the
// scheduler gives its rank to the pod of a live server (the view names it, that pod's heartbeat
// answers ask its agent to run the rank), the takeover registers as the rank's next incarnation,
// and the job goes on; a takeover that ends before it served, or no live server to take it,
// fails the job saying why; without the servers' bounds nothing changes.
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/running_job_fixture.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

class ServerTakeoverTest : public testing::RunningJobTest {
 protected:
  void Configure(SchedulerConfig& c) override { c.elastic = ElasticBounds{true, 2, 2, 1, 3}; }

  Status Exit(v1::Role role, int32_t rank, int64_t incarnation, int32_t code) {
    v1::ReportExitRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_incarnation(incarnation);
    r.set_exit_code(code);
    return state_->ReportExit(r);
  }
  std::vector<int32_t> TakeOvers(int32_t server, int64_t incarnation = 1) {
    v1::HeartbeatRequest r;
    r.set_role(v1::ROLE_SERVER);
    r.set_rank(server);
    r.set_incarnation(incarnation);
    auto resp = state_->Heartbeat(r);
    EXPECT_TRUE(resp.ok()) << resp.status().ToString();
    if (!resp.ok()) return {};
    return {resp->take_over_servers().begin(), resp->take_over_servers().end()};
  }
  Status Ready(int32_t server, const std::string& address) {
    v1::ReportReadyRequest r;
    r.set_role(v1::ROLE_SERVER);
    r.set_rank(server);
    r.set_address(address);
    return state_->ReportReady(r);
  }
  // Both workers declare one key: the shard map exists (a server resize needs it).
  void DeclareOneKey() {
  std::optional<StatusOr<std::shared_ptr<const v1::ShardMap>>> got[2];
  for (int32_t w = 0; w < 2; ++w) {
    v1::DeclareKeysRequest r;
    r.set_worker_rank(w);
    v1::KeySpec* key = r.add_keys();
    key->set_id(0);
    key->set_num_elements(16);
    key->set_dtype(v1::DTYPE_FLOAT32);
    state_->DeclareKeys(r, clock_.Now() + 60s, [&got, w](auto a) { got[w] = a; });
  }
  ASSERT_TRUE(got[1].has_value() && got[1]->ok());
  }
  // Server `server`'s program of `incarnation` ready at `address` and pinging: it serves.
  void Serve(int32_t server, int64_t incarnation, const std::string& address) {
    ASSERT_TRUE(Ready(server, address).ok());
    v1::PingRequest ping;
    ping.set_role(v1::ROLE_SERVER);
    ping.set_rank(server);
    ping.set_incarnation(incarnation);
    state_->Ping(ping);
  }
  void Beat(v1::Role role, int32_t rank, int64_t incarnation = 1) {
    v1::HeartbeatRequest r;
    r.set_role(role);
    r.set_rank(rank);
    r.set_incarnation(incarnation);
    ASSERT_TRUE(state_->Heartbeat(r).ok());
  }
};

TEST_F(ServerTakeoverTest, AServerExitedForGoodIsRunByTheOtherServersPodAndTheJobGoesOn) {
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 1, 137).ok());
  v1::ClusterView view = state_->GetCluster();
  EXPECT_FALSE(view.failed()) << view.failure_message();
  ASSERT_EQ(view.servers_size(), 2);
  const v1::NodeInfo& lost = view.servers(1);
  EXPECT_EQ(lost.taken_over_by(), "mlp-server-0");
  EXPECT_EQ(lost.lost_pod(), "mlp-server-1");
  EXPECT_EQ(lost.pod_name(), "mlp-server-0+server-1");
  EXPECT_EQ(lost.pod_name(), TakeOverPodName("mlp-server-0", 1));
  EXPECT_FALSE(lost.ready());
  EXPECT_FALSE(lost.exited());
  EXPECT_TRUE(lost.restarting()) << "the others wait for it as for a restart";
  EXPECT_EQ(state_->stats().servers_taken_over, 1);
  // Server 0's agent is asked to run rank 1, on every beat; nobody else is.
  EXPECT_EQ(TakeOvers(0), std::vector<int32_t>{1});
  EXPECT_EQ(TakeOvers(0), std::vector<int32_t>{1});

  // The takeover registers as rank 1's next incarnation and serves at a new address.
  auto reg = Reg(v1::ROLE_SERVER, "mlp-server-0+server-1");
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->rank(), 1);
  EXPECT_EQ(reg->incarnation(), 2);
  ASSERT_TRUE(Ready(1, "127.0.0.1:7100").ok());
  view = state_->GetCluster();
  EXPECT_TRUE(view.complete());
  EXPECT_EQ(view.servers(1).address(), "127.0.0.1:7100");
  EXPECT_EQ(view.servers(1).restarts(), 1) << "a takeover is one restart of the rank";
  EXPECT_TRUE(state_->Training());
  // The lost pod's name no longer holds the rank (here it gets the free slot a grow would use).
  auto old_pod = Reg(v1::ROLE_SERVER, "mlp-server-1");
  EXPECT_TRUE(!old_pod.ok() || old_pod->rank() != 1) << old_pod->rank();
  EXPECT_EQ(state_->GetCluster().servers(1).pod_name(), "mlp-server-0+server-1");

  // Lost again after it served (its pod's agent gone): taken over again.
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 2, 143).ok());
  view = state_->GetCluster();
  EXPECT_FALSE(view.failed()) << view.failure_message();
  EXPECT_EQ(view.servers(1).taken_over_by(), "mlp-server-0");
  EXPECT_EQ(view.servers(1).lost_pod(), "mlp-server-1") << "the pod it had first";
  EXPECT_EQ(state_->stats().servers_taken_over, 2);
}

// A shrink that removes the rank taken over gives it its own pod name back: a later grow starts
// that pod as server 1 again (trellis-launch and the operator make it under its own name).
TEST_F(ServerTakeoverTest, AShrinkThatRemovesTheRankTakenOverGivesItsPodNameBack) {
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 1, 137).ok());
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "mlp-server-0+server-1").ok());
  ASSERT_NO_FATAL_FAILURE(Serve(1, 2, "127.0.0.1:7100"));
  ASSERT_NO_FATAL_FAILURE(DeclareOneKey());
  v1::ResizeRequest shrink;
  shrink.set_servers(1);
  ASSERT_TRUE(state_->Resize(shrink).ok());
  std::optional<StatusOr<v1::ReachStepResponse>> decided;
  for (int32_t w = 0; w < 2; ++w) {
    v1::ReachStepRequest r;
    r.set_rank(w);
    r.set_incarnation(1);
    r.set_epoch(1);
    r.set_step(10);
    state_->ReachStep(r, clock_.Now() + 60s, [&decided](auto a) { decided = a; });
  }
  ASSERT_TRUE(decided.has_value() && decided->ok() && (*decided)->decided());
  EXPECT_TRUE(TakeOvers(0).empty()) << "server 0's pod no longer runs rank 1";
  // Grown back: the rank's own pod registers as server 1.
  auto back = Reg(v1::ROLE_SERVER, "mlp-server-1");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rank(), 1);
}

// The slices move from their owners at a server resize: not while one is being taken over.
TEST_F(ServerTakeoverTest, TheServersAreNotResizedWhileOneIsBeingTakenOver) {
  ASSERT_NO_FATAL_FAILURE(DeclareOneKey());
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 1, 137).ok());
  v1::ResizeRequest shrink;
  shrink.set_servers(1);
  auto refused = state_->Resize(shrink);
  ASSERT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("server 1 is being taken over by pod mlp-server-0; resize the servers "
                                            "once it serves again"),
            std::string::npos)
      << refused.status().message();
  // Served (registered, ready, its program's first ping): the resize is taken.
  auto reg = Reg(v1::ROLE_SERVER, "mlp-server-0+server-1");
  ASSERT_TRUE(reg.ok());
  ASSERT_NO_FATAL_FAILURE(Serve(1, reg->incarnation(), "127.0.0.1:7100"));
  EXPECT_TRUE(state_->Resize(shrink).ok());
}

TEST_F(ServerTakeoverTest, ATakeoverThatEndsBeforeItServedFailsTheJobSayingWhy) {
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, 1, 137).ok());
  EXPECT_EQ(state_->GetCluster().servers(0).taken_over_by(), "mlp-server-1");
  EXPECT_EQ(TakeOvers(1), std::vector<int32_t>{0});
  auto reg = Reg(v1::ROLE_SERVER, "mlp-server-1+server-0");
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, reg->incarnation(), 3).ok());
  const v1::ClusterView view = state_->GetCluster();
  ASSERT_TRUE(view.failed());
  EXPECT_NE(view.failure_message().find("taken over by pod mlp-server-1, where its program ended before it served"),
            std::string::npos)
      << view.failure_message();
}

TEST_F(ServerTakeoverTest, WithNoOtherServerLiveTheJobFailsSayingWhy) {
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 1, 137).ok());
  // Server 0 goes before rank 1's takeover served: nobody is left to take either over.
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 0, 1, 137).ok());
  const v1::ClusterView view = state_->GetCluster();
  ASSERT_TRUE(view.failed());
  EXPECT_NE(view.failure_message().find("server 0 (pod mlp-server-0) exited for good: exit code 137 (killed by "
                                        "SIGKILL); no other server is live to take its shards over"),
            std::string::npos)
      << view.failure_message();
}

TEST_F(ServerTakeoverTest, ASilentServerIsTakenOverAfterTheRegistrationTimeout) {
  // Server 1's agent falls silent; the others beat on.
  for (int i = 0; i < 8; ++i) {
    clock_.Advance(9s);
    ASSERT_NO_FATAL_FAILURE(Beat(v1::ROLE_SERVER, 0));
    ASSERT_NO_FATAL_FAILURE(Beat(v1::ROLE_WORKER, 0));
    ASSERT_NO_FATAL_FAILURE(Beat(v1::ROLE_WORKER, 1));
    state_->Sweep();
  }
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_FALSE(view.failed()) << view.failure_message();
  EXPECT_EQ(view.servers(1).taken_over_by(), "mlp-server-0");
  EXPECT_FALSE(view.servers(1).dead());
  EXPECT_EQ(TakeOvers(0), std::vector<int32_t>{1});
}

TEST_F(ServerTakeoverTest, NothingIsTakenOverOnceTheJobEnds) {
  ASSERT_TRUE(Exit(v1::ROLE_WORKER, 0, 1, 0).ok());  // a worker finished: the job is ending
  ASSERT_TRUE(Exit(v1::ROLE_SERVER, 1, 1, 143).ok());
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_TRUE(view.servers(1).taken_over_by().empty());
  EXPECT_TRUE(view.servers(1).exited());
  EXPECT_TRUE(TakeOvers(0).empty());
}

class FixedServersTest : public testing::RunningJobTest {
 protected:
  void Configure(SchedulerConfig& c) override { c.elastic = ElasticBounds{true, 1, 2, 2, 2}; }  // as a job file without them
};

TEST_F(FixedServersTest, WithoutTheServersBoundsALostServerIsNotTakenOver) {
  v1::ReportExitRequest r;
  r.set_role(v1::ROLE_SERVER);
  r.set_rank(1);
  r.set_incarnation(1);
  r.set_exit_code(137);
  ASSERT_TRUE(state_->ReportExit(r).ok());
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_TRUE(view.servers(1).taken_over_by().empty());
  EXPECT_TRUE(view.servers(1).exited());
  EXPECT_EQ(state_->stats().servers_taken_over, 0);
  v1::HeartbeatRequest b;
  b.set_role(v1::ROLE_SERVER);
  b.set_rank(0);
  b.set_incarnation(1);
  auto resp = state_->Heartbeat(b);
  ASSERT_TRUE(resp.ok());
  EXPECT_EQ(resp->take_over_servers_size(), 0);
}

}  // namespace
}  // namespace trellis
