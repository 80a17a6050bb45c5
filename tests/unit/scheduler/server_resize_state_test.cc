// A resize of an elastic job's servers through the scheduler's state (docs/elastic.md#servers):
// refused before the shard map exists and with a worker resize in the same ask, announced once
// the server it adds is ready, decided by the workers' reports with the map relaid out on the new
// servers and their addresses, and the servers removed no longer part of the job's view.
#include <gtest/gtest.h>

#include <optional>

#include "scheduler/scheduler_state.h"
#include "tests/unit/scheduler/running_job_fixture.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

class ServerResizeStateTest : public testing::RunningJobTest {
 protected:
  // 2 workers fixed; servers 1..3 (the fixture starts 2).
  void Configure(SchedulerConfig& c) override {
    c.elastic = ElasticBounds{true, 2, 2, 1, 3};
  }
  void DeclareKeys() {
    std::optional<StatusOr<std::shared_ptr<const v1::ShardMap>>> got[2];
    for (int32_t w = 0; w < 2; ++w) {
      v1::DeclareKeysRequest r;
      r.set_worker_rank(w);
      for (int32_t k = 0; k < 6; ++k) {
        v1::KeySpec* key = r.add_keys();
        key->set_id(static_cast<uint64_t>(k));
        key->set_num_elements(16);
        key->set_dtype(v1::DTYPE_FLOAT32);
      }
      state_->DeclareKeys(r, clock_.Now() + 60s, [&got, w](auto a) { got[w] = a; });
    }
    ASSERT_TRUE(got[0].has_value() && got[0]->ok());
    map_ = ***got[0];
  }
  StatusOr<v1::ResizeResponse> ResizeServers(int32_t servers, int32_t workers = 0) {
    v1::ResizeRequest req;
    req.set_servers(servers);
    req.set_workers(workers);
    req.set_reason("test");
    return state_->Resize(req);
  }
  // Both workers report step `step` for `epoch`: the second report's answer.
  v1::ReachStepResponse ReachBoth(int64_t epoch, int64_t step) {
    std::optional<StatusOr<v1::ReachStepResponse>> last;
    for (int32_t w = 0; w < 2; ++w) {
      v1::ReachStepRequest r;
      r.set_rank(w);
      r.set_incarnation(1);
      r.set_epoch(epoch);
      r.set_step(step);
      state_->ReachStep(r, clock_.Now() + 60s, [&last](auto a) { last = a; });
    }
    EXPECT_TRUE(last.has_value() && last->ok());
    return last.has_value() && last->ok() ? **last : v1::ReachStepResponse{};
  }
  v1::ShardMap map_;
};

TEST_F(ServerResizeStateTest, ServersGrowOnceReadyAndShrinkWithTheMapRelaidOut) {
  auto early = ResizeServers(3);
  ASSERT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("before the workers declared their keys"), std::string::npos)
      << early.status().message();
  ASSERT_NO_FATAL_FAILURE(DeclareKeys());
  EXPECT_EQ(map_.num_servers(), 2);
  auto both = ResizeServers(3, 1);
  ASSERT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("one kind at a time"), std::string::npos) << both.status().message();
  EXPECT_EQ(state_->GetCluster().num_servers(), 2);
  EXPECT_EQ(state_->GetCluster().server_slots(), 3);
  EXPECT_TRUE(state_->Training());

  // 2 -> 3: not announced before server 2 (its slot outside the world so far) is ready.
  auto grow = ResizeServers(3);
  ASSERT_TRUE(grow.ok()) << grow.status().ToString();
  EXPECT_EQ(grow->epoch(), 1);
  EXPECT_EQ(state_->Ping().resize_epoch(), 0);
  int32_t pending_servers = 0;
  int64_t pending_epoch = 0;
  state_->World(&pending_epoch, nullptr, nullptr, &pending_servers);
  EXPECT_EQ(pending_servers, 3);
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "mlp-server-2").ok());
  v1::ReportReadyRequest ready;
  ready.set_role(v1::ROLE_SERVER);
  ready.set_rank(2);
  ready.set_address("127.0.0.1:7002");
  ASSERT_TRUE(state_->ReportReady(ready).ok());
  EXPECT_EQ(state_->Ping().resize_epoch(), 1);
  v1::ReachStepResponse decided = ReachBoth(1, 10);
  ASSERT_TRUE(decided.decided());
  EXPECT_EQ(decided.world().servers(), 3);
  EXPECT_EQ(decided.world().from_step(), 12);
  EXPECT_EQ(decided.shard_map().num_servers(), 3);
  EXPECT_EQ(decided.shard_map().world_epoch(), 1);
  EXPECT_EQ(decided.shard_map().keys_size(), map_.keys_size()) << "the same keys, relaid out";
  ASSERT_EQ(decided.server_addresses_size(), 3);
  EXPECT_EQ(decided.server_addresses(2), "127.0.0.1:7002");
  EXPECT_EQ(state_->GetCluster().num_servers(), 3);
  EXPECT_EQ(state_->stats().world_servers, 3);
  EXPECT_EQ(state_->stats().resizes, 1);

  // 3 -> 1: announced at once; servers 1 and 2 leave the view, and are not reported dead.
  ASSERT_TRUE(ResizeServers(1).ok());
  EXPECT_EQ(state_->Ping().resize_epoch(), 2);
  decided = ReachBoth(2, 20);
  ASSERT_TRUE(decided.decided());
  EXPECT_EQ(decided.shard_map().num_servers(), 1);
  ASSERT_EQ(decided.server_addresses_size(), 1);
  EXPECT_EQ(decided.server_addresses(0), "127.0.0.1:7000");
  const v1::ClusterView view = state_->GetCluster();
  EXPECT_EQ(view.num_servers(), 1);
  EXPECT_EQ(view.servers_size(), 1);
  EXPECT_EQ(view.server_slots(), 3);
  EXPECT_EQ(state_->stats().world_servers, 1);
  EXPECT_TRUE(state_->Training());

  auto below = ResizeServers(4);
  ASSERT_EQ(below.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(below.status().message().find("outside spec.elastic [1, 3]"), std::string::npos);
}

// A scheduler restarted after a server resize (docs/elastic.md#what-survives-what): each worker
// hands back the world of 3 servers, the relaid-out map and the 3 addresses; the new scheduler
// (its job file still says 2 servers) takes them back and lists the 3 servers, and refuses more
// addresses than the job may ever have servers.
TEST_F(ServerResizeStateTest, ARestartedSchedulerTakesTheResizedServersBackFromTheWorkers) {
  ASSERT_NO_FATAL_FAILURE(DeclareKeys());
  ASSERT_TRUE(ResizeServers(3).ok());
  ASSERT_TRUE(Reg(v1::ROLE_SERVER, "mlp-server-2").ok());
  v1::ReportReadyRequest ready;
  ready.set_role(v1::ROLE_SERVER);
  ready.set_rank(2);
  ready.set_address("127.0.0.1:7002");
  ASSERT_TRUE(state_->ReportReady(ready).ok());
  const v1::ReachStepResponse decided = ReachBoth(1, 10);
  ASSERT_TRUE(decided.decided());

  SchedulerConfig c;
  c.job_name = "mlp";
  c.num_servers = 2;
  c.num_workers = 2;
  c.slice_bytes = 16;
  Configure(c);
  SchedulerState fresh(c, &clock_);
  v1::ResumeRequest back;
  back.set_rank(0);
  back.set_incarnation(1);
  *back.mutable_shard_map() = decided.shard_map();
  *back.mutable_world() = decided.world();
  for (const auto& a : decided.server_addresses()) back.add_server_addresses(a);
  auto resumed = fresh.Resume(back);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  const v1::ClusterView view = fresh.GetCluster();
  EXPECT_EQ(view.num_servers(), 3);
  ASSERT_EQ(view.servers_size(), 3);
  EXPECT_EQ(view.servers(2).address(), "127.0.0.1:7002");
  EXPECT_EQ(fresh.stats().world_servers, 3);

  v1::ResumeRequest too_many = back;
  too_many.set_rank(1);
  too_many.add_server_addresses("127.0.0.1:7003");
  auto refused = fresh.Resume(too_many);
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("hands back 4 server addresses; the job has at most 3 servers"),
            std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace trellis
