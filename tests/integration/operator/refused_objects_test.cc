// Objects built from a job that the API server refuses: the job says so (a condition with the
// server's message and a Warning Event), Failed when retrying cannot help (400/422), retried with
// the condition standing while the refusal may pass (403 quota, 5xx, 429).
#include <gtest/gtest.h>

#include <cpprest/uri.h>

#include "tests/integration/operator/reconcile_fixture.h"

namespace trellis::op::testing {
namespace {

constexpr char kJob[] = R"({"image":"img:1","servers":{"replicas":1},"workers":{"replicas":2,"command":["w"]}})";

class RefusedObjectsTest : public ReconcileTest {
 protected:
  // The double answers the next `count` POSTs of `kind` (pods, services) with this error.
  void Refuse(const std::string& kind, int code, const std::string& reason, const std::string& message,
              int count = 1) {
    Hook("fail?method=POST&path=/api/v1/namespaces/default/" + kind + "&count=" + std::to_string(count) +
         "&code=" + std::to_string(code) + "&reason=" + reason +
         "&message=" + web::uri::encode_data_string(message));
  }
  std::vector<Json> Warnings() {
    std::vector<Json> out;
    for (const Json& e : Events()) {
      if (Str(e, {"type"}) == "Warning") out.push_back(e);
    }
    return out;
  }
};

TEST_F(RefusedObjectsTest, InvalidPodFailsTheJobWithTheServersMessage) {
  const std::string why =
      "Pod \"bad-scheduler\" is invalid: spec.containers[0].ports[0].containerPort: Invalid value: 70000: "
      "must be between 1 and 65535, inclusive";
  CreateJob("bad", kJob);
  Refuse("pods", 422, "Invalid", why);
  Reconcile("bad");  // the first pod POST (the scheduler's) gets the 422
  Json job = GetJob("bad");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed"), "True");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "FailedCreate");
  const std::string message = Condition(job, "Failed", "message");
  EXPECT_NE(message.find("the API server refused Pod default/bad-scheduler"), std::string::npos) << message;
  EXPECT_NE(message.find("HTTP 422 Invalid: " + why), std::string::npos) << message;
  EXPECT_FALSE(Str(job, {"status", "completionTime"}).empty());
  auto warnings = Warnings();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(Str(warnings[0], {"reason"}), "FailedCreate");
  EXPECT_EQ(Str(warnings[0], {"involvedObject", "kind"}), "TrainingJob");
  EXPECT_EQ(Str(warnings[0], {"involvedObject", "name"}), "bad");
  EXPECT_NE(Str(warnings[0], {"message"}).find("containerPort: Invalid value: 70000"), std::string::npos);
  // Failed is final: no more pods, no second warning.
  Reconcile("bad");
  Reconcile("bad");
  EXPECT_EQ(PodNames("bad"), std::vector<std::string>{});
  EXPECT_EQ(Phase("bad"), "Failed");
  EXPECT_EQ(Warnings().size(), 1u);
}

TEST_F(RefusedObjectsTest, InvalidServiceFailsTheJob) {
  CreateJob("svc", kJob);
  Refuse("services", 422, "Invalid", "Service \"svc-scheduler\" is invalid: metadata.name: Invalid value");
  Reconcile("svc");
  Json job = GetJob("svc");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_NE(Condition(job, "Failed", "message").find("refused Service default/svc-scheduler: HTTP 422 Invalid"),
            std::string::npos)
      << Condition(job, "Failed", "message");
  EXPECT_EQ(Warnings().size(), 1u);
}

TEST_F(RefusedObjectsTest, QuotaRefusalIsRetriedWithTheConditionStandingUntilItPasses) {
  CreateJob("quota", kJob);
  Refuse("pods", 403, "Forbidden",
         "pods \"quota-scheduler\" is forbidden: exceeded quota: compute, requested: cpu=2, used: cpu=8, limited: cpu=8",
         2);
  auto r = reconciler_->Reconcile("default", "quota");
  ASSERT_FALSE(r.ok());  // the controller retries with back-off
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied);
  Json job = GetJob("quota");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Condition(job, "FailedCreate"), "True");
  EXPECT_EQ(Condition(job, "FailedCreate", "reason"), "Forbidden");
  EXPECT_NE(Condition(job, "FailedCreate", "message").find("exceeded quota: compute"), std::string::npos);
  ASSERT_EQ(Warnings().size(), 1u);
  EXPECT_EQ(Str(Warnings()[0], {"reason"}), "FailedCreate");
  // The same refusal again: no new status, no second event.
  EXPECT_FALSE(reconciler_->Reconcile("default", "quota").ok());
  EXPECT_EQ(Warnings().size(), 1u);
  // Quota freed: every pod is created and the condition says the refusal is over.
  Reconcile("quota");
  EXPECT_EQ(PodNames("quota").size(), 4u);
  job = GetJob("quota");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Condition(job, "FailedCreate"), "False");
  EXPECT_EQ(Condition(job, "FailedCreate", "reason"), "Created");
}

TEST_F(RefusedObjectsTest, ServerErrorsAndThrottlingAreTransient) {
  CreateJob("busy", kJob);
  Refuse("pods", 429, "TooManyRequests", "too many requests, please try again later");
  auto r = reconciler_->Reconcile("default", "busy");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(Condition(GetJob("busy"), "FailedCreate", "reason"), "TooManyRequests");
  Refuse("pods", 500, "InternalError", "etcdserver: request timed out");
  r = reconciler_->Reconcile("default", "busy");
  ASSERT_FALSE(r.ok());
  Json job = GetJob("busy");
  EXPECT_NE(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "FailedCreate", "reason"), "ServerUnavailable");
  EXPECT_NE(Condition(job, "FailedCreate", "message").find("etcdserver: request timed out"), std::string::npos);
  EXPECT_EQ(Warnings().size(), 2u);  // one per distinct refusal
  Reconcile("busy");
  EXPECT_EQ(Condition(GetJob("busy"), "FailedCreate"), "False");
}

}  // namespace
}  // namespace trellis::op::testing
