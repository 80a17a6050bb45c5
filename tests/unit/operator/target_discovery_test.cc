// Prometheus HTTP service discovery through the operator (/sd/targets): every process of every
// running TrainingJob pod, labelled as trellis-launch's file-SD targets are, and the operator.
#include "operator/target_discovery.h"

#include <gtest/gtest.h>

namespace trellis::op {
namespace {

Json Pod(const std::string& name, const std::string& role, const std::string& rank, const std::string& ip,
         const std::string& phase, bool with_agent = true) {
  std::string labels = R"("trellis.io/job-name": "mlp", "trellis.io/role": ")" + role + "\"";
  if (!rank.empty()) labels += R"(, "trellis.io/rank": ")" + rank + "\"";
  std::string ports = R"({"name": "data", "containerPort": 7100}, {"name": "metrics", "containerPort": 9100})";
  if (with_agent) ports += R"(, {"name": "agent-metrics", "containerPort": 9101})";
  std::string status = R"("phase": ")" + phase + "\"" + (ip.empty() ? "" : R"(, "podIP": ")" + ip + "\"");
  auto j = ParseJson(R"({"metadata": {"name": ")" + name + R"(", "namespace": "team", "labels": {)" + labels +
                     R"(}}, "spec": {"containers": [{"name": "trellis", "ports": [)" + ports +
                     R"(]}]}, "status": {)" + status + "}}");
  EXPECT_TRUE(j.has_value()) << name;
  return j.value_or(Json::object());
}

TEST(TargetDiscoveryTest, AWorkerPodGivesItsProgramAndItsAgent) {
  auto groups = PodTargetGroups(Pod("mlp-worker-1", "worker", "1", "10.244.0.7", "Running"));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].at("targets").at(0).as_string(), "10.244.0.7:9100");
  EXPECT_EQ(Str(groups[0], {"labels", "trellis_process"}), "worker-1");
  EXPECT_EQ(Str(groups[0], {"labels", "job"}), "mlp");
  EXPECT_EQ(Str(groups[0], {"labels", "role"}), "worker");
  EXPECT_EQ(Str(groups[0], {"labels", "rank"}), "1");
  EXPECT_EQ(Str(groups[0], {"labels", "namespace"}), "team");
  EXPECT_EQ(Str(groups[0], {"labels", "pod"}), "mlp-worker-1");
  EXPECT_EQ(groups[1].at("targets").at(0).as_string(), "10.244.0.7:9101");
  EXPECT_EQ(Str(groups[1], {"labels", "trellis_process"}), "worker-1-agent");
}

TEST(TargetDiscoveryTest, TheSchedulerHasNoRankAndNoAgent) {
  auto groups = PodTargetGroups(Pod("mlp-scheduler", "scheduler", "", "10.244.0.3", "Running", false));
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(Str(groups[0], {"labels", "trellis_process"}), "scheduler");
  EXPECT_EQ(At(groups[0], {"labels", "rank"}), nullptr);
}

TEST(TargetDiscoveryTest, PodsWithoutAnAddressEndedOrNotAJobsAreLeftOut) {
  EXPECT_TRUE(PodTargetGroups(Pod("a", "worker", "0", "", "Pending")).empty());
  EXPECT_TRUE(PodTargetGroups(Pod("b", "worker", "0", "10.0.0.9", "Succeeded")).empty());
  EXPECT_TRUE(PodTargetGroups(Pod("c", "worker", "0", "10.0.0.9", "Failed")).empty());
  auto other = ParseJson(R"({"metadata": {"name": "web", "labels": {"app": "web"}},
      "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 80}]}]},
      "status": {"phase": "Running", "podIP": "10.0.0.5"}})");
  ASSERT_TRUE(other.has_value());
  EXPECT_TRUE(PodTargetGroups(*other).empty());
  // Hostile content: a port out of range, containers that are not a list.
  auto bad = ParseJson(R"({"metadata": {"name": "x", "labels": {"trellis.io/job-name": "j"}},
      "spec": {"containers": [{"ports": [{"name": "metrics", "containerPort": 70000}]}, 5]},
      "status": {"phase": "Running", "podIP": "10.0.0.5"}})");
  ASSERT_TRUE(bad.has_value());
  EXPECT_TRUE(PodTargetGroups(*bad).empty());
}

TEST(TargetDiscoveryTest, IPv6AddressesAreBracketed) {
  auto groups = PodTargetGroups(Pod("mlp-server-0", "server", "0", "fd00::7", "Running"));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].at("targets").at(0).as_string(), "[fd00::7]:9100");
}

TEST(TargetDiscoveryTest, TheBodyListsEveryPodThenTheOperatorAsPrometheusWantsIt) {
  std::vector<Json> pods = {Pod("mlp-scheduler", "scheduler", "", "10.244.0.3", "Running", false),
                            Pod("mlp-worker-0", "worker", "0", "10.244.0.5", "Running"),
                            Pod("mlp-worker-1", "worker", "1", "", "Pending")};
  auto body = ParseJson(TargetsJson(pods, "trellis-operator-metrics.trellis-system.svc:8080"));
  ASSERT_TRUE(body.has_value());
  ASSERT_TRUE(body->is_array());
  ASSERT_EQ(body->size(), 4u);
  const Json& op = body->at(3);
  EXPECT_EQ(op.at("targets").at(0).as_string(), "trellis-operator-metrics.trellis-system.svc:8080");
  EXPECT_EQ(Str(op, {"labels", "trellis_process"}), "operator");
  auto no_self = ParseJson(TargetsJson({}, ""));
  ASSERT_TRUE(no_self.has_value());
  EXPECT_EQ(no_self->size(), 0u);
}

}  // namespace
}  // namespace trellis::op
