// The status after the end and while suspended: counts show the pods that are still there, not
// the ones being deleted; a failed job names the pod that failed first, with its own exit code.
#include <gtest/gtest.h>

#include "operator/job_status.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::ApiJob;
using testing::kSpec;
using testing::kT0;
using testing::Step;

// kSpec's pods (testing::AllPods), the scheduler and servers being deleted when `others_deleting`.
std::vector<ObservedPod> Pods(const std::string& worker_phase, bool others_deleting = false) {
  std::vector<ObservedPod> pods = testing::AllPods(worker_phase);
  for (ObservedPod& p : pods) p.deleting = p.role != PodRole::kWorker && others_deleting;
  return pods;
}

int64_t Count(const Json& status, const char* role, const char* field) {
  return Int(status, {"replicaStatuses", role, field}).value_or(-1);
}

TEST(JobStatusEndTest, AfterSuccessDeletedPodsNoLongerCountAsRunning) {
  Json job = ApiJob(kSpec);
  Step(job, Pods("Running"), kT0);
  ASSERT_EQ(Str(job, {"status", "servers"}), "2/2");
  // The round that sees success deletes the scheduler and servers (cleanPodPolicy Running).
  JobPlan done = Step(job, Pods("Succeeded"), kT0 + std::chrono::seconds(1));
  ASSERT_EQ(Str(done.status, {"phase"}), "Succeeded");
  EXPECT_EQ(Str(done.status, {"servers"}), "0/2");
  EXPECT_EQ(Count(done.status, "server", "running"), 0);
  EXPECT_EQ(Count(done.status, "server", "active"), 0);
  EXPECT_EQ(Count(done.status, "scheduler", "active"), 0);
  EXPECT_EQ(Str(done.status, {"workers"}), "3/3");
  EXPECT_EQ(Count(done.status, "worker", "succeeded"), 3);
  // Next rounds: the pods linger while terminating, then are gone; still nothing running.
  JobPlan terminating = Step(job, Pods("Succeeded", /*others_deleting=*/true), kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(terminating.status, {"servers"}), "0/2");
  EXPECT_EQ(Count(terminating.status, "server", "running"), 0);
  // cleanPodPolicy All later removes the workers too: what succeeded stays counted.
  job["spec"]["runPolicy"]["cleanPodPolicy"] = JStr("All");
  JobPlan gone = Step(job, {}, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Count(gone.status, "worker", "succeeded"), 3);
  EXPECT_EQ(Str(gone.status, {"workers"}), "3/3");
  EXPECT_EQ(Str(gone.status, {"servers"}), "0/2");
}

TEST(JobStatusEndTest, WhileSuspendedNothingCountsAsRunning) {
  Json job = ApiJob(kSpec);
  Step(job, Pods("Running"), kT0);
  ASSERT_EQ(Str(job, {"status", "workers"}), "3/3");
  job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
  JobPlan s = Step(job, Pods("Running"), kT0 + std::chrono::seconds(1));
  ASSERT_EQ(Str(s.status, {"phase"}), "Suspended");
  EXPECT_EQ(s.remove.size(), 6u);
  EXPECT_EQ(Str(s.status, {"servers"}), "0/2");
  EXPECT_EQ(Str(s.status, {"workers"}), "0/3");
  for (const char* role : {"scheduler", "server", "worker"}) {
    EXPECT_EQ(Count(s.status, role, "active"), 0) << role;
    EXPECT_EQ(Count(s.status, role, "running"), 0) << role;
  }
  JobPlan later = Step(job, {}, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(later.status, {"workers"}), "0/3");
  EXPECT_EQ(later.status, s.status);  // level-based: nothing more to write
}

TEST(JobStatusEndTest, FailedJobNamesThePodThatFailedFirstWithItsExitCode) {
  Json job = ApiJob(R"({"servers":{"replicas":2},"workers":{"replicas":3,"command":["w"]},
                        "runPolicy":{"restartPolicy":"Never"}})");
  Step(job, Pods("Running"), kT0);
  // Worker 2 crashed (exit 3); workers 0 and 1 failed after it, having lost their peer.
  auto pods = Pods("Running");
  pods[3].phase = "Failed";
  pods[3].exit_code = 1;
  pods[3].finished_at = "2027-01-15T08:00:09Z";
  pods[4].phase = "Failed";
  pods[4].exit_code = 1;
  pods[4].finished_at = "2027-01-15T08:00:07Z";
  pods[5].phase = "Failed";
  pods[5].exit_code = 3;
  pods[5].finished_at = "2027-01-15T08:00:05Z";
  JobPlan p = Step(job, pods, kT0 + std::chrono::seconds(10));
  ASSERT_EQ(Str(p.status, {"phase"}), "Failed");
  const std::string message = p.event_message;
  EXPECT_NE(message.find("worker 2 (pod mlp-worker-2) failed with exit code 3"), std::string::npos) << message;
}

TEST(JobStatusEndTest, ObservePodReadsTheAgentsContainerNotASidecar) {
  Json pod = *ParseJson(R"({"metadata":{"name":"mlp-worker-1","labels":{"trellis.io/role":"worker",
      "trellis.io/rank":"1"}},"status":{"phase":"Failed","containerStatuses":[
      {"name":"a-logger","state":{"terminated":{"exitCode":0,"finishedAt":"2027-01-15T08:00:20Z"}}},
      {"name":"trellis","state":{"terminated":{"exitCode":137,"finishedAt":"2027-01-15T08:00:05Z"}}}]}})");
  auto o = ObservePod(pod);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->exit_code, 137);
  EXPECT_EQ(o->finished_at, "2027-01-15T08:00:05Z");
}

}  // namespace
}  // namespace trellis::op
