#include "operator/job_status.h"

#include <gtest/gtest.h>

#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::AllPods;
using testing::ApiJob;
using testing::Condition;
using testing::kSpec;
using testing::kT0;
using testing::Names;
using testing::Pod;
using testing::Step;

TEST(PlanJobTest, NewJobCreatesEveryPodAndIsPending) {
  Json job = ApiJob(kSpec);
  JobPlan plan = Step(job, {}, kT0);
  EXPECT_EQ(Names(plan.create), (std::vector<std::string>{"mlp-scheduler", "mlp-server-0", "mlp-server-1",
                                                   "mlp-worker-0", "mlp-worker-1", "mlp-worker-2"}));
  EXPECT_TRUE(plan.ensure_support);
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_EQ(Str(plan.status, {"phase"}), "Pending");
  EXPECT_EQ(Str(plan.status, {"startTime"}), FormatTime(kT0));
  EXPECT_EQ(Condition(plan.status, "Created"), "True");
  EXPECT_EQ(plan.event_reason, "JobCreated");
  // The same world again: nothing new to create is asked twice differently, no new event.
  JobPlan again = Step(job, {}, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(again.create.size(), 6u);
  EXPECT_TRUE(again.event_type.empty());
}

TEST(PlanJobTest, AllRunningThenWorkersSucceedThenCleanUpAndTtl) {
  Json job = ApiJob(R"({"workers":{"replicas":3,"command":["w"]},"servers":{"replicas":2},
                        "runPolicy":{"ttlSecondsAfterFinished":60}})");
  Step(job, {}, kT0);
  JobPlan running = Step(job, AllPods("Running"), kT0 + std::chrono::seconds(5));
  EXPECT_TRUE(running.create.empty());
  EXPECT_EQ(Str(running.status, {"phase"}), "Running");
  EXPECT_EQ(Str(running.status, {"workers"}), "3/3");
  EXPECT_EQ(Str(running.status, {"servers"}), "2/2");
  EXPECT_EQ(Condition(running.status, "Running"), "True");
  EXPECT_EQ(Int(running.status, {"replicaStatuses", "worker", "active"}), 3);

  auto done_at = kT0 + std::chrono::seconds(30);
  JobPlan done = Step(job, AllPods("Succeeded"), done_at);
  EXPECT_EQ(Str(done.status, {"phase"}), "Succeeded");
  EXPECT_EQ(Str(done.status, {"completionTime"}), FormatTime(done_at));
  EXPECT_EQ(Condition(done.status, "Succeeded"), "True");
  EXPECT_EQ(Condition(done.status, "Running"), "False");
  EXPECT_EQ(done.event_reason, "JobSucceeded");
  EXPECT_EQ(Int(done.status, {"replicaStatuses", "worker", "succeeded"}), 3);
  // cleanPodPolicy Running (default): the scheduler and servers still running are deleted.
  EXPECT_EQ(done.remove, (std::vector<std::string>{"mlp-scheduler", "mlp-server-0", "mlp-server-1"}));
  EXPECT_TRUE(done.create.empty());
  ASSERT_TRUE(done.requeue_after);
  EXPECT_EQ(*done.requeue_after, std::chrono::seconds(60));
  EXPECT_FALSE(done.delete_job);

  JobPlan later = Step(job, {}, done_at + std::chrono::seconds(59));
  EXPECT_FALSE(later.delete_job);
  EXPECT_EQ(Str(later.status, {"phase"}), "Succeeded");
  JobPlan expired = Step(job, {}, done_at + std::chrono::seconds(60));
  EXPECT_TRUE(expired.delete_job);
}

// Its scheduler cannot lose a worker: the pods stay until the job next starts
// (elastic_resize_test.cc has the refusal and the resumed run).
TEST(PlanJobTest, ScaledDownSpecOnARunningJobKeepsItsPods) {
  Json job = ApiJob(kSpec);  // 2 servers, 3 workers
  Step(job, AllPods("Running"), kT0);
  job["spec"]["workers"]["replicas"] = Json::number(2);
  JobPlan p = Step(job, AllPods("Running"), kT0 + std::chrono::seconds(1));
  EXPECT_TRUE(p.remove.empty());
  EXPECT_TRUE(p.create.empty());
  EXPECT_EQ(Str(p.status, {"phase"}), "Running");
}

TEST(PlanJobTest, CleanPodPolicyAllAndNone) {
  for (const char* policy : {"All", "None"}) {
    Json job = ApiJob(std::string(R"({"workers":{"replicas":3,"command":["w"]},"servers":{"replicas":2},
                                     "runPolicy":{"cleanPodPolicy":")") + policy + "\"}}");
    JobPlan done = Step(job, AllPods("Succeeded"), kT0);
    EXPECT_EQ(Str(done.status, {"phase"}), "Succeeded");
    EXPECT_EQ(done.remove.size(), std::string(policy) == "All" ? 6u : 0u) << policy;
  }
}

TEST(PlanJobTest, FailedWorkerUnderOnFailureIsRecreatedUntilBackoffLimit) {
  Json job = ApiJob(kSpec);  // backoffLimit 2, OnFailure
  Step(job, AllPods("Running"), kT0);
  auto pods = AllPods("Running");
  pods[4] = Pod(PodRole::kWorker, 1, "Failed", 3);
  JobPlan r1 = Step(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(r1.status, {"phase"}), "Restarting");
  EXPECT_EQ(r1.remove, (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(Int(r1.status, {"restarts"}), 1);
  EXPECT_EQ(Int(r1.status, {"replicaStatuses", "worker", "restarts"}), 1);
  EXPECT_EQ(r1.event_type, "Warning");
  EXPECT_EQ(r1.event_reason, "PodRestarted");
  // The pod is gone: recreated, still Restarting until it runs again.
  pods.erase(pods.begin() + 4);
  JobPlan r2 = Step(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Names(r2.create), (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(Str(r2.status, {"phase"}), "Restarting");
  JobPlan back = Step(job, AllPods("Running"), kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(back.status, {"phase"}), "Running");
  EXPECT_EQ(Condition(back.status, "Restarting"), "False");

  pods = AllPods("Running");
  pods[3] = Pod(PodRole::kWorker, 0, "Failed", 1);
  EXPECT_EQ(Str(Step(job, pods, kT0 + std::chrono::seconds(4)).status, {"phase"}), "Restarting");
  pods = AllPods("Running");
  pods[5] = Pod(PodRole::kWorker, 2, "Failed", 1);
  JobPlan failed = Step(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(failed.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(failed.status, "Failed", "reason"), "BackoffLimitExceeded");
  EXPECT_EQ(Condition(failed.status, "Failed", "message"),
            "job mlp: worker 2 (pod mlp-worker-2) failed with exit code 1 after 2 restarts (backoffLimit 2); "
            "the first failure: worker 1 (pod mlp-worker-1) failed with exit code 3");
  EXPECT_EQ(Int(failed.status, {"restarts"}), 2);
  EXPECT_TRUE(failed.create.empty());
}

TEST(PlanJobTest, NeverAndExitCodePolicies) {
  Json never = ApiJob(R"({"workers":{"command":["w"],"restartPolicy":"Never"}})");
  JobPlan p = Step(never, {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                           Pod(PodRole::kWorker, 0, "Failed", 137)},
                   kT0);
  EXPECT_EQ(Str(p.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(p.status, "Failed", "reason"), "PodFailed");
  EXPECT_EQ(Condition(p.status, "Failed", "message"),
            "job mlp: worker 0 (pod mlp-worker-0) failed with exit code 137 (restartPolicy Never)");

  Json ec = ApiJob(R"({"workers":{"command":["w"]},"runPolicy":{"restartPolicy":"ExitCode"}})");
  JobPlan signal = PlanJob(ec, ParseJobSpec(ec.serialize()),
                           {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kWorker, 0, "Failed", 137)}, kT0);
  EXPECT_EQ(Str(signal.status, {"phase"}), "Restarting");  // killed by a signal: retried
  JobPlan code = PlanJob(ec, ParseJobSpec(ec.serialize()),
                         {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kWorker, 0, "Failed", 2)}, kT0);
  EXPECT_EQ(Str(code.status, {"phase"}), "Failed");  // 1..127: permanent

  // Exit 78 (a configuration error) is permanent under OnFailure too: no pod is recreated.
  Json onf = ApiJob(R"({"workers":{"command":["w"]}})");
  JobPlan config = PlanJob(onf, ParseJobSpec(onf.serialize()),
                           {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kWorker, 0, "Failed", 78)}, kT0);
  EXPECT_EQ(Str(config.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(config.status, "Failed", "message"),
            "job mlp: worker 0 (pod mlp-worker-0) failed with exit code 78 (restartPolicy OnFailure)");
  EXPECT_TRUE(config.create.empty());
}

// A deleted pod (kubectl delete, a drain) is simply missing: recreated, not counted; its
// replacement rejoins the running job (docs/kubernetes.md "What survives a pod deletion").
TEST(PlanJobTest, DeletedPodIsRecreatedWithoutCountingARestart) {
  Json job = ApiJob(kSpec);  // OnFailure
  Step(job, AllPods("Running"), kT0);
  auto pods = AllPods("Running");
  pods.erase(pods.begin() + 4);  // worker 1 deleted
  JobPlan p = Step(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Names(p.create), (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(Int(p.status, {"restarts"}), 0);
  EXPECT_EQ(Str(p.status, {"phase"}), "Restarting");
  EXPECT_EQ(p.event_reason, "PodRecreated");
  EXPECT_EQ(p.event_message,
            "job mlp: pod mlp-worker-1 is gone (deleted or evicted); recreating it (not counted toward backoffLimit)");
  // Running again once the replacement runs.
  JobPlan back = Step(job, AllPods("Running"), kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(back.status, {"phase"}), "Running");
  EXPECT_EQ(Int(back.status, {"restarts"}), 0);
}

// The operator may see the deleted pod before it is gone (deletionTimestamp set, still listed):
// the running job is replacing a pod, never Pending again (as a user watching its phase, or
// tests/k8s_real/pod_delete_test.py, reads it).
TEST(PlanJobTest, PodSeenWhileBeingDeletedKeepsARunningJobOutOfPending) {
  Json job = ApiJob(kSpec);  // OnFailure
  Step(job, AllPods("Running"), kT0);
  auto pods = AllPods("Running");
  pods[4].deleting = true;  // worker 1, `kubectl delete pod` under way
  JobPlan p = Step(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(p.status, {"phase"}), "Restarting");
  EXPECT_EQ(Int(p.status, {"restarts"}), 0);
  EXPECT_TRUE(p.create.empty());  // not before the old one is gone (same name)
  EXPECT_EQ(p.event_reason, "PodRecreated");
  EXPECT_EQ(p.event_message,
            "job mlp: pod mlp-worker-1 is being deleted (or evicted); it is recreated once gone "
            "(not counted toward backoffLimit)");
  pods.erase(pods.begin() + 4);  // gone
  JobPlan gone = Step(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(gone.status, {"phase"}), "Restarting");
  EXPECT_EQ(Names(gone.create), (std::vector<std::string>{"mlp-worker-1"}));
  JobPlan back = Step(job, AllPods("Running"), kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(back.status, {"phase"}), "Running");
}

// Evicted by the kubelet (the pod stays, Failed, reason Evicted) or marked DisruptionTarget:
// recreated without counting toward backoffLimit, as a Kubernetes Job's podFailurePolicy
// Ignore rule for DisruptionTarget does.
TEST(PlanJobTest, EvictedPodIsRecreatedWithoutCountingTowardBackoffLimit) {
  Json job = ApiJob(kSpec);  // backoffLimit 2
  Step(job, AllPods("Running"), kT0);
  for (int round = 1; round <= 4; ++round) {  // more evictions than backoffLimit allows failures
    auto pods = AllPods("Running");
    pods[4] = Pod(PodRole::kWorker, 1, "Failed", 143);
    pods[4].disruption = round % 2 ? "Evicted" : "EvictionByEvictionAPI";
    JobPlan p = Step(job, pods, kT0 + std::chrono::seconds(round));
    EXPECT_EQ(Str(p.status, {"phase"}), "Restarting");
    EXPECT_EQ(p.remove, (std::vector<std::string>{"mlp-worker-1"}));
    EXPECT_EQ(Int(p.status, {"restarts"}), 0);
    EXPECT_EQ(p.event_reason, "PodEvicted");
    Step(job, AllPods("Running"), kT0 + std::chrono::seconds(round) + std::chrono::milliseconds(500));
  }
  EXPECT_EQ(Str(job["status"], {"phase"}), "Running");
  EXPECT_EQ(Condition(job["status"], "Restarting", "reason"), "JobRunning");

  Json never = ApiJob(R"({"workers":{"command":["w"],"replicas":2,"restartPolicy":"Never"}})");
  std::vector<ObservedPod> pods = {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                                   Pod(PodRole::kWorker, 0, "Running"), Pod(PodRole::kWorker, 1, "Failed", 143)};
  pods[3].disruption = "Evicted";
  JobPlan f = Step(never, pods, kT0);
  EXPECT_EQ(Str(f.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(f.status, "Failed", "reason"), "PodDeleted");
  EXPECT_EQ(Condition(f.status, "Failed", "message"),
            "job mlp: worker 1 (pod mlp-worker-1) was evicted (Evicted) while the job ran (restartPolicy Never "
            "does not replace it)");
}

// Under Never a pod deleted while the job runs fails the job, naming the deletion rather than
// the bystanders that failed because of it.
TEST(PlanJobTest, DeletedPodUnderNeverFailsTheJobSayingItWasDeleted) {
  Json job = ApiJob(R"({"workers":{"command":["w"],"replicas":2,"restartPolicy":"Never"}})");
  std::vector<ObservedPod> all = {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                                  Pod(PodRole::kWorker, 0, "Running"), Pod(PodRole::kWorker, 1, "Running")};
  // Before the job ran, a missing pod is only not created yet.
  EXPECT_EQ(Str(Step(job, {all[0], all[1], all[2]}, kT0).status, {"phase"}), "Pending");
  EXPECT_EQ(Str(Step(job, all, kT0 + std::chrono::seconds(1)).status, {"phase"}), "Running");
  auto pods = all;
  pods[3].deleting = true;                              // worker 1 being deleted...
  pods[2] = Pod(PodRole::kWorker, 0, "Failed", 1);      // ...and worker 0 aborted because of it
  JobPlan p = Step(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(p.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(p.status, "Failed", "reason"), "PodDeleted");
  EXPECT_EQ(Condition(p.status, "Failed", "message"),
            "job mlp: worker 1 (pod mlp-worker-1) was deleted or evicted while the job ran (restartPolicy "
            "Never does not replace it)");
  EXPECT_TRUE(p.create.empty());
}

// A failed scheduler pod is recreated (its successor recovers the job from its members), counted
// against backoffLimit; only one that keeps failing fails the job.
TEST(PlanJobTest, AFailedSchedulerIsRecreatedUntilBackoffLimit) {
  Json job = ApiJob(kSpec);  // backoffLimit 2
  Step(job, AllPods("Running"), kT0);
  auto pods = AllPods("Running");
  pods[0] = Pod(PodRole::kScheduler, 0, "Failed", 137);
  JobPlan r1 = Step(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(r1.status, {"phase"}), "Restarting");
  EXPECT_EQ(r1.remove, (std::vector<std::string>{"mlp-scheduler"}));
  EXPECT_EQ(Int(r1.status, {"replicaStatuses", "scheduler", "restarts"}), 1);
  EXPECT_EQ(Int(r1.status, {"restarts"}), 1);
  EXPECT_EQ(r1.event_reason, "SchedulerRestarted");
  pods.erase(pods.begin());
  JobPlan r2 = Step(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Names(r2.create), (std::vector<std::string>{"mlp-scheduler"}));
  EXPECT_EQ(Str(Step(job, AllPods("Running"), kT0 + std::chrono::seconds(3)).status, {"phase"}),
            "Running");

  pods = AllPods("Running");
  pods[0] = Pod(PodRole::kScheduler, 0, "Failed", 1);
  EXPECT_EQ(Str(Step(job, pods, kT0 + std::chrono::seconds(4)).status, {"phase"}), "Restarting");
  JobPlan failed = Step(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(failed.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(failed.status, "Failed", "reason"), "SchedulerFailed");
  EXPECT_EQ(Condition(failed.status, "Failed", "message"),
            "job mlp: scheduler (pod mlp-scheduler) failed with exit code 1 after 2 restarts "
            "(backoffLimit 2); the first failure: scheduler (pod mlp-scheduler) failed with exit code 137");
}

TEST(PlanJobTest, DeadlineExceededFailsAndRequeuesBeforeIt) {
  Json job = ApiJob(R"({"workers":{"command":["w"]},"runPolicy":{"activeDeadlineSeconds":100}})");
  JobPlan first = Step(job, {}, kT0);
  ASSERT_TRUE(first.requeue_after);
  EXPECT_EQ(*first.requeue_after, std::chrono::seconds(100));
  JobPlan late = Step(job, {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                            Pod(PodRole::kWorker, 0, "Running")},
                      kT0 + std::chrono::seconds(100));
  EXPECT_EQ(Str(late.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(late.status, "Failed", "reason"), "DeadlineExceeded");
  EXPECT_EQ(Condition(late.status, "Failed", "message"), "job mlp ran longer than activeDeadlineSeconds (100s)");
  EXPECT_EQ(late.remove.size(), 3u);  // cleanPodPolicy Running
}

TEST(PlanJobTest, SuspendDeletesPodsAndResumeRecreatesWithFreshClock) {
  Json job = ApiJob(R"({"workers":{"command":["w"]},"runPolicy":{"suspend":true,"activeDeadlineSeconds":50}})");
  std::vector<ObservedPod> pods = {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kWorker, 0, "Running")};
  JobPlan s = Step(job, pods, kT0);
  EXPECT_EQ(Str(s.status, {"phase"}), "Suspended");
  EXPECT_EQ(s.remove, (std::vector<std::string>{"mlp-scheduler", "mlp-worker-0"}));
  EXPECT_TRUE(s.create.empty());
  EXPECT_FALSE(At(s.status, {"startTime"}));
  EXPECT_EQ(Condition(s.status, "Suspended"), "True");

  job["spec"]["runPolicy"]["suspend"] = Json::boolean(false);
  auto resume_at = kT0 + std::chrono::seconds(1000);  // far past the deadline had it kept counting
  JobPlan r = Step(job, {}, resume_at);
  EXPECT_EQ(Str(r.status, {"phase"}), "Pending");
  EXPECT_EQ(r.create.size(), 3u);
  EXPECT_EQ(Str(r.status, {"startTime"}), FormatTime(resume_at));
  EXPECT_EQ(Condition(r.status, "Suspended"), "False");
  EXPECT_EQ(r.event_reason, "JobResumed");
}

TEST(PlanJobTest, InvalidSpecFailsWithTheJobModelsMessageAndCreatesNothing) {
  Json job = ApiJob(R"({"workers":{"replica":2,"command":["w"]},"keyDispatch":"random"})");
  JobPlan p = Step(job, {}, kT0);
  EXPECT_EQ(Str(p.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(p.status, "Failed", "reason"), "InvalidSpec");
  EXPECT_EQ(Condition(p.status, "Failed", "message"),
            "spec.workers.replica: unknown field; did you mean \"replicas\"?\n"
            "spec.keyDispatch: must be one of roundRobin, hash, balanced, got \"random\"");
  EXPECT_TRUE(p.create.empty());
  EXPECT_FALSE(p.ensure_support);
  EXPECT_EQ(p.event_type, "Warning");
}

TEST(ObservePodTest, ReadsLabelsPhaseAndExitCode) {
  Json pod = *ParseJson(R"({"metadata":{"name":"mlp-worker-4","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"4"}},"status":{"phase":"Failed","containerStatuses":[{"state":{"terminated":
      {"exitCode":137}}}]}})");
  auto o = ObservePod(pod);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->role, PodRole::kWorker);
  EXPECT_EQ(o->index, 4);
  EXPECT_EQ(o->phase, "Failed");
  EXPECT_EQ(o->exit_code, 137);
  EXPECT_EQ(o->disruption, "");
  auto evicted = ObservePod(*ParseJson(R"({"metadata":{"name":"mlp-worker-1","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"1"}},"status":{"phase":"Failed","reason":"Evicted"}})"));
  ASSERT_TRUE(evicted);
  EXPECT_EQ(evicted->disruption, "Evicted");
  auto target = ObservePod(*ParseJson(R"({"metadata":{"name":"mlp-worker-1","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"1"}},"status":{"phase":"Failed","conditions":[{"type":"Ready","status":"False"},
      {"type":"DisruptionTarget","status":"True","reason":"PreemptionByScheduler"}]}})"));
  ASSERT_TRUE(target);
  EXPECT_EQ(target->disruption, "PreemptionByScheduler");
  // A peer's garbage labels are not ours: ignored, never a crash.
  EXPECT_FALSE(ObservePod(*ParseJson(R"({"metadata":{"name":"x","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"-1x"}}})")));
  EXPECT_FALSE(ObservePod(*ParseJson(R"({"metadata":{"name":"x","labels":{"trellis.io/role":7}}})")));
  EXPECT_FALSE(ObservePod(*ParseJson(R"([1,2])")));
}

}  // namespace
}  // namespace trellis::op
