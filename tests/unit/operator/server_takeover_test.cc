// A parameter server of a job with elastic servers lost for good on Kubernetes
// (operator/server_takeover.h; docs/elastic.md#losing-a-server): its pod failed under Never and
// its agent said another server's pod took its rank over, so the job does not fail, no pod is
// made again for it, status.world.takenOver and one ServerTakenOver event say who runs it now,
// and the job succeeds when its workers do. The same failed pod without that word fails the job.
#include <gtest/gtest.h>

#include "operator/server_takeover.h"
#include "tests/unit/operator/elastic_testing.h"

namespace trellis::op {
namespace {

using namespace testing;  // NOLINT: the job documents and pods shared by the plan's tests

constexpr char kTakenOver[] =
    "server 1 (pod mlp-server-1) is lost for good; its shards are taken over by pod mlp-server-0, which runs it "
    "from now on (spec.elastic)";

std::string ElasticServersSpec() {
  return R"({"servers":{"replicas":2},
             "workers":{"replicas":3,"command":["trellis-mlp"]},
             "elastic":{"minWorkers":1,"maxWorkers":3,"minServers":1,"maxServers":3},
             "runPolicy":{"restartPolicy":"Never"}})";
}

std::vector<ObservedPod> Server1Failed(const std::string& taken_over) {
  std::vector<ObservedPod> pods = AllPods("Running");
  pods[2].phase = "Failed";
  pods[2].exit_code = 137;
  pods[2].report.exit = "program killed by SIGKILL (code 137)";
  pods[2].report.taken_over = taken_over;
  return pods;
}

int Count(const std::vector<JobPlan::Event>& events, const std::string& reason) {
  int n = 0;
  for (const auto& e : events) n += e.reason == reason;
  return n;
}

TEST(ServerTakeoverTest, ATakenOverServerDoesNotFailTheJobAndIsNotMadeAgain) {
  Json job = ApiJob(ElasticServersSpec());
  Round(job, AllPods("Running"), kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

  std::vector<ObservedPod> pods = Server1Failed(kTakenOver);
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  for (const DesiredPod& d : plan.create) EXPECT_NE(d.name, "mlp-server-1");
  for (const std::string& r : plan.remove) EXPECT_NE(r, "mlp-server-1") << "kept for its logs";
  EXPECT_EQ(Count(plan.events, "ServerTakenOver"), 1);
  const Json* taken = At(job, {"status", "world", "takenOver"});
  ASSERT_TRUE(taken && taken->is_array() && taken->size() == 1);
  EXPECT_EQ(Int(taken->at(0), {"server"}), 1);
  EXPECT_EQ(Str(taken->at(0), {"pod"}), "mlp-server-1");
  EXPECT_EQ(Str(taken->at(0), {"reason"}), kTakenOver);

  // Noted once.
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Count(plan.events, "ServerTakenOver"), 0);
  EXPECT_EQ(At(job, {"status", "world", "takenOver"})->size(), 1u);

  for (int w = 3; w < 6; ++w) pods[w].phase = "Succeeded";
  Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(job, {"status", "phase"}), kSucceeded);
}

// A shrink to 1 server removes the rank taken over; grown back to 2, its pod is made again.
TEST(ServerTakeoverTest, AShrinkForgetsTheRankTakenOverSoAGrowMakesItsPodAgain) {
  Json job = ApiJob(ElasticServersSpec());
  Round(job, AllPods("Running"), kT0);
  std::vector<ObservedPod> pods = Server1Failed(kTakenOver);
  Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_EQ(At(job, {"status", "world", "takenOver"})->size(), 1u);
  job["status"]["world"]["servers"] = Json::number(1);  // the scheduler's world after the shrink
  Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(At(job, {"status", "world", "takenOver"})->size(), 0u);
  pods.erase(pods.begin() + 2);  // its pod removed with the shrink
  // A grow back to 2 under way (spec.servers.replicas 2, the world's 1).
  job["status"]["lastResize"] = Json::object();
  job["status"]["lastResize"]["kind"] = JStr("Servers");
  job["status"]["lastResize"]["from"] = Json::number(1);
  job["status"]["lastResize"]["to"] = Json::number(2);
  job["status"]["lastResize"]["outcome"] = JStr("Pending");
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  bool made = false;
  for (const DesiredPod& d : plan.create) made = made || d.name == "mlp-server-1";
  EXPECT_TRUE(made) << "server 1's pod is made again for the grow back";
}

TEST(ServerTakeoverTest, AFailedServerNobodyTookOverFailsTheJobAsBefore) {
  Json job = ApiJob(ElasticServersSpec());
  Round(job, AllPods("Running"), kT0);
  Round(job, Server1Failed(""), kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kFailed);
}

// A spot node reclaimed, `kubectl delete pod`: under Never the server's agent tells the scheduler,
// which takes the rank over; the operator neither fails the job nor makes the pod again.
TEST(ServerTakeoverTest, AServerPodDeletedUnderNeverIsLeftToTheTakeover) {
  Json job = ApiJob(ElasticServersSpec());
  Round(job, AllPods("Running"), kT0);
  std::vector<ObservedPod> pods = AllPods("Running");
  pods[2].deleting = true;
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  pods.erase(pods.begin() + 2);  // gone
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  for (const DesiredPod& d : plan.create) EXPECT_NE(d.name, "mlp-server-1");
  // The progress poller notes the scheduler's takeover; the job succeeds with its workers.
  Json status = job["status"];
  EXPECT_NE(NoteTakeOver(status, "mlp", 1, "mlp-server-1", kTakenOver, kT0), "");
  EXPECT_EQ(NoteTakeOver(status, "mlp", 1, "mlp-server-1", kTakenOver, kT0), "") << "noted once";
  job["status"] = status;
  for (int w = 2; w < 5; ++w) pods[w].phase = "Succeeded";
  Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(job, {"status", "phase"}), kSucceeded);
}

TEST(ServerTakeoverTest, WithoutElasticServersADeletedServerPodUnderNeverFailsTheJob) {
  Json job = ApiJob(ElasticSpec(3));  // workers elastic, servers fixed
  Round(job, AllPods("Running"), kT0);
  std::vector<ObservedPod> pods = AllPods("Running");
  pods.erase(pods.begin() + 2);
  Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kFailed);
}

}  // namespace
}  // namespace trellis::op
