// The reconciler against the API double, one Reconcile call at a time with a fake clock: each
// test drives the world (pod phases) through the double's API like a kubelet would.
#include <gtest/gtest.h>

#include "tests/integration/operator/reconcile_fixture.h"

namespace trellis::op::testing {
namespace {

using std::chrono::seconds;
using Names = std::vector<std::string>;

constexpr char kTwoByTwo[] = R"({"image":"img:1","servers":{"replicas":2},"workers":{"replicas":2,"command":["w"]},
    "runPolicy":{"ttlSecondsAfterFinished":60,"backoffLimit":1}})";

TEST_F(ReconcileTest, CreateRunSucceedThenTtlDeletesJobAndCascades) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"),
            (Names{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0", "mlp-worker-1"}));
  EXPECT_EQ(Phase("mlp"), "Pending");
  EXPECT_TRUE(client_->Get(kSecrets, "default", "mlp-token").ok());
  EXPECT_TRUE(client_->Get(kServices, "default", "mlp-scheduler").ok());
  EXPECT_TRUE(client_->Get(kConfigMaps, "default", "mlp-config").ok());
  // Events are recorded on transitions.
  auto events = client_->List(kEvents, "default");
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->at("items").size(), 1u);
  EXPECT_EQ(Str(events->at("items").at(0), {"reason"}), "JobCreated");

  SetAllPodsPhase("mlp", "Running");
  now_ += seconds(5);
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Running");
  EXPECT_EQ(Str(job, {"status", "workers"}), "2/2");
  EXPECT_EQ(Condition(job, "Running"), "True");

  SetPodPhase("mlp-worker-0", "Succeeded", 0);
  SetPodPhase("mlp-worker-1", "Succeeded", 0);
  now_ += seconds(5);
  auto requeue = Reconcile("mlp");
  job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Succeeded");
  EXPECT_EQ(Condition(job, "Succeeded", "reason"), "JobSucceeded");
  EXPECT_EQ(Str(job, {"status", "completionTime"}), FormatTime(now_));
  // cleanPodPolicy Running: the scheduler and servers are gone, the finished workers stay.
  EXPECT_EQ(PodNames("mlp"), (Names{"mlp-worker-0", "mlp-worker-1"}));
  ASSERT_TRUE(requeue);
  EXPECT_EQ(*requeue, seconds(60));

  now_ += seconds(60);
  Reconcile("mlp");
  EXPECT_EQ(client_->Get(kTrainingJobs, "default", "mlp").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(PodNames("mlp"), Names{});  // ownerReferences cascade
  EXPECT_EQ(client_->Get(kSecrets, "default", "mlp-token").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(Reconcile("mlp"));       // a deleted job is nothing to do
}

TEST_F(ReconcileTest, InvalidSpecFailsWithTheLaunchersMessageAndNoPods) {
  CreateJob("bad", R"({"workers":{"replicas":-2,"command":["w"]},"sliceBytes":"4MB"})");
  Reconcile("bad");
  Json job = GetJob("bad");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "InvalidSpec");
  EXPECT_EQ(Condition(job, "Failed", "message"),
            "spec.workers.replicas: must be >= 1, got -2\n"
            "spec.sliceBytes: must be a number of bytes or a quantity such as 512Ki, 4Mi or 1Gi, got \"4MB\"");
  EXPECT_EQ(PodNames("bad"), Names{});
  Reconcile("bad");  // idempotent: nothing changes, no second event
  EXPECT_EQ(client_->List(kEvents, "default")->at("items").size(), 1u);
}

TEST_F(ReconcileTest, RestartedOperatorMidJobCreatesNoDuplicatePods) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  SetPodPhase("mlp-worker-1", "Running");
  // A new operator process: fresh reconciler, no memory of the first.
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [this] { return now_; });
  Reconcile("mlp");
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
  Json created = Stats().at("created");
  EXPECT_EQ(created.at("Pod").size(), 5u) << created.serialize();
  EXPECT_EQ(created.at("Secret").size(), 1u);  // the token is not regenerated
}

TEST_F(ReconcileTest, FailingWorkerUnderOnFailureIsRecreatedThenBackoffLimitFailsTheJob) {
  CreateJob("mlp", kTwoByTwo);  // OnFailure (default), backoffLimit 1
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  const std::string uid0 = Str(*client_->Get(kPods, "default", "mlp-worker-1"), {"metadata", "uid"});
  SetPodPhase("mlp-worker-1", "Failed", 1);
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Restarting");
  EXPECT_EQ(Int(job, {"status", "restarts"}), 1);
  Reconcile("mlp");  // the failed pod is gone: recreated under the same name
  auto pod = client_->Get(kPods, "default", "mlp-worker-1");
  ASSERT_TRUE(pod.ok());
  EXPECT_NE(Str(*pod, {"metadata", "uid"}), uid0);
  SetPodPhase("mlp-worker-1", "Running");
  Reconcile("mlp");
  EXPECT_EQ(Phase("mlp"), "Running");

  SetPodPhase("mlp-worker-0", "Failed", 2);
  Reconcile("mlp");
  job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "BackoffLimitExceeded");
  EXPECT_EQ(PodNames("mlp"), Names{"mlp-worker-0"});  // running pods cleaned up, the failed one kept
}

TEST_F(ReconcileTest, DeadlineExceeded) {
  CreateJob("slow", R"({"workers":{"command":["w"]},"runPolicy":{"activeDeadlineSeconds":30}})");
  auto requeue = Reconcile("slow");
  ASSERT_TRUE(requeue);
  EXPECT_EQ(*requeue, seconds(30));
  SetAllPodsPhase("slow", "Running");
  now_ += seconds(30);
  Reconcile("slow");
  Json job = GetJob("slow");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Failed");
  EXPECT_EQ(Condition(job, "Failed", "reason"), "DeadlineExceeded");
  EXPECT_EQ(PodNames("slow"), Names{});
}

TEST_F(ReconcileTest, SuspendDeletesPodsResumeRecreatesThem) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  SetAllPodsPhase("mlp", "Running");
  Reconcile("mlp");
  auto patched = client_->MergePatch(kTrainingJobs, "default", "mlp",
                                     *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})"));
  ASSERT_TRUE(patched.ok()) << patched.status().message();
  Reconcile("mlp");
  EXPECT_EQ(Phase("mlp"), "Suspended");
  EXPECT_EQ(PodNames("mlp"), Names{});
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":false}}})")).ok());
  Reconcile("mlp");
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Condition(job, "Suspended"), "False");
  EXPECT_EQ(PodNames("mlp").size(), 5u);
}

TEST_F(ReconcileTest, JobResizedWhileSuspendedResumesWithTheNewSizeAndJobFile) {
  CreateJob("mlp", kTwoByTwo);
  Reconcile("mlp");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"runPolicy":{"suspend":true}}})")).ok());
  Reconcile("mlp");
  ASSERT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                  *ParseJson(R"({"spec":{"workers":{"replicas":3},"runPolicy":{"suspend":false}}})"))
                  .ok());
  Reconcile("mlp");
  EXPECT_EQ(PodNames("mlp"), (Names{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0", "mlp-worker-1",
                                    "mlp-worker-2"}));
  auto cm = client_->Get(kConfigMaps, "default", "mlp-config");
  ASSERT_TRUE(cm.ok());
  auto spec = ParseJobSpec(Str(*cm, {"data", "job.yaml"}));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->workers.replicas, 3);  // the restarted scheduler expects 3 workers
}

TEST_F(ReconcileTest, StatusWriteConflictIsRetriedFromAFreshRead) {
  CreateJob("mlp", kTwoByTwo);
  // Someone edits the job between the reconciler's read and its status write (the clock is read
  // in between): the first write gets 409 Conflict; the retry reads again and wins.
  int calls = 0;
  reconciler_ = std::make_unique<Reconciler>(*client_, OperatorSettings{}, [&] {
    if (calls++ == 0) {
      EXPECT_TRUE(client_->MergePatch(kTrainingJobs, "default", "mlp",
                                      *ParseJson(R"({"metadata":{"labels":{"edited":"yes"}}})")).ok());
    }
    return now_;
  });
  Reconcile("mlp");  // without the retry this returns ABORTED and the helper fails the test
  Json job = GetJob("mlp");
  EXPECT_EQ(Str(job, {"status", "phase"}), "Pending");
  EXPECT_EQ(Str(job, {"metadata", "labels", "edited"}), "yes");
  EXPECT_GE(calls, 2);
  EXPECT_EQ(PodNames("mlp").size(), 5u);
}

}  // namespace
}  // namespace trellis::op::testing
