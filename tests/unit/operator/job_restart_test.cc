// Whole-job restarts (operator/job_restart.h, issue 35 part 4): a failure the job's scheduler
// could not heal restarts every pod under runPolicy.failurePolicy RestartJob, counted toward
// backoffLimit and shown in the status; every worker pod stopped from outside restarts the job
// uncounted; the new pods are created only once every old one is gone.
#include <gtest/gtest.h>

#include <algorithm>

#include "operator/job_status.h"
#include "operator/progress_status.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::AllPods;
using testing::ApiJob;
using testing::Condition;
using testing::kT0;
using testing::Names;
using testing::Pod;
using testing::Step;

using std::chrono::seconds;

// kSpec's shape (a scheduler, 2 servers, 3 workers), backoffLimit 2.
constexpr char kRestartJob[] =
    R"({"servers":{"replicas":2},"workers":{"replicas":3,"command":["trellis-mlp"]},
        "runPolicy":{"backoffLimit":2,"failurePolicy":"RestartJob"}})";
constexpr char kFailJob[] =
    R"({"servers":{"replicas":2},"workers":{"replicas":3,"command":["trellis-mlp"]},
        "runPolicy":{"backoffLimit":2}})";

const std::vector<std::string> kAllNames = {"mlp-scheduler", "mlp-server-0", "mlp-server-1",
                                            "mlp-worker-0",  "mlp-worker-1", "mlp-worker-2"};

// Every worker restarted at once, the rejoin found no donor: the scheduler failed the job, and
// the workers' agents say so in their termination reports.
std::vector<ObservedPod> EveryWorkerLost(int exit_code = 1) {
  std::vector<ObservedPod> pods = AllPods("Running");
  for (auto& p : pods) {
    if (p.role != PodRole::kWorker) continue;
    p.phase = "Failed";
    p.exit_code = exit_code;
    p.report.job_failed = "worker 0 (incarnation 2) asks to rejoin, but every worker that held the model is gone";
  }
  return pods;
}

std::vector<ObservedPod> Deleting(std::vector<ObservedPod> pods) {
  for (auto& p : pods) p.deleting = true;
  return pods;
}

std::vector<std::string> Sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

TEST(JobRestartTest, AFailureTheSchedulerCannotHealRestartsEveryPodOnceTheOldOnesAreGone) {
  Json job = ApiJob(kRestartJob);
  Step(job, AllPods("Running"), kT0);
  JobPlan plan = Step(job, EveryWorkerLost(), kT0 + seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Restarting");
  EXPECT_EQ(Sorted(plan.remove), kAllNames) << "every pod goes, the scheduler and servers too";
  EXPECT_TRUE(plan.create.empty());
  EXPECT_EQ(Int(plan.status, {"jobRestarts"}), 1);
  EXPECT_EQ(Int(plan.status, {"restarts"}), 1);
  EXPECT_EQ(Str(plan.status, {"lastRestart", "reason"}), "JobRestarted");
  EXPECT_TRUE(Bool(plan.status, {"lastRestart", "wholeJob"}));
  EXPECT_TRUE(Bool(plan.status, {"lastRestart", "oldPodsGoing"}));
  const std::string msg = Str(plan.status, {"lastRestart", "message"});
  EXPECT_NE(msg.find("every worker that held the model is gone"), std::string::npos) << msg;
  EXPECT_NE(msg.find("restarting every pod, from the newest checkpoint"), std::string::npos) << msg;
  EXPECT_NE(msg.find("restart 1 of at most 2"), std::string::npos) << msg;
  EXPECT_EQ(Condition(plan.status, "Restarting", "reason"), "JobRestarted");
  EXPECT_EQ(plan.event_type, "Warning");

  // The old pods are still going: nothing is created (a new pod could register with the old
  // scheduler), nothing is counted again.
  plan = Step(job, Deleting(EveryWorkerLost()), kT0 + seconds(6));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_EQ(Str(plan.status, {"phase"}), "Restarting");
  EXPECT_EQ(Int(plan.status, {"jobRestarts"}), 1);
  plan = Step(job, {Pod(PodRole::kScheduler, 0, "Running")}, kT0 + seconds(7));
  EXPECT_TRUE(plan.create.empty()) << "the last old pod (the scheduler) is not marked deleting yet";
  EXPECT_EQ(plan.remove, std::vector<std::string>{"mlp-scheduler"});

  // Every old pod gone: the whole set again.
  plan = Step(job, {}, kT0 + seconds(8));
  EXPECT_EQ(Sorted(Names(plan.create)), kAllNames);
  EXPECT_FALSE(Bool(plan.status, {"lastRestart", "oldPodsGoing"}));
  // New pods not seen yet while Restarting: created again, no second restart.
  plan = Step(job, {Pod(PodRole::kScheduler, 0, "Running")}, kT0 + seconds(9));
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_EQ(plan.create.size(), 5u);
  plan = Step(job, AllPods("Running"), kT0 + seconds(10));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Running");
  EXPECT_EQ(Int(plan.status, {"jobRestarts"}), 1) << "kept while the job runs on";

  // Again, and a third time: backoffLimit 2 ends it.
  plan = Step(job, EveryWorkerLost(), kT0 + seconds(20));
  EXPECT_EQ(Int(plan.status, {"jobRestarts"}), 2);
  Step(job, {}, kT0 + seconds(21));
  Step(job, AllPods("Running"), kT0 + seconds(22));
  plan = Step(job, EveryWorkerLost(), kT0 + seconds(30));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(plan.status, "Failed", "reason"), "BackoffLimitExceeded");
  const std::string failed = Condition(plan.status, "Failed", "message");
  EXPECT_NE(failed.find("after 2 restarts (backoffLimit 2)"), std::string::npos) << failed;
  EXPECT_EQ(Int(plan.status, {"jobRestarts"}), 2);
}

TEST(JobRestartTest, UnderFailJobTheSameFailureFailsTheJob) {
  Json job = ApiJob(kFailJob);
  Step(job, AllPods("Running"), kT0);
  JobPlan plan = Step(job, EveryWorkerLost(), kT0 + seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_TRUE(plan.create.empty());
  EXPECT_FALSE(At(plan.status, {"jobRestarts"}));
  const std::string msg = Condition(plan.status, "Failed", "message");
  EXPECT_NE(msg.find("so no pod is recreated"), std::string::npos) << msg;
}

TEST(JobRestartTest, AConfigurationTheProgramRefusesIsNotRestarted) {
  Json job = ApiJob(kRestartJob);
  Step(job, AllPods("Running"), kT0);
  JobPlan plan = Step(job, EveryWorkerLost(/*exit_code=*/78), kT0 + seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_FALSE(At(plan.status, {"jobRestarts"}));
}

TEST(JobRestartTest, PodRestartsAndJobRestartsShareBackoffLimit) {
  Json job = ApiJob(kRestartJob);
  Step(job, AllPods("Running"), kT0);
  // Two lone worker failures the job heals (pod replaced, counted) use up backoffLimit 2...
  for (int i = 0; i < 2; ++i) {
    std::vector<ObservedPod> pods = AllPods("Running");
    pods[3].phase = "Failed";
    pods[3].exit_code = 1;
    JobPlan plan = Step(job, pods, kT0 + seconds(5 + 10 * i));
    EXPECT_EQ(plan.remove, std::vector<std::string>{"mlp-worker-0"});
    EXPECT_EQ(Str(plan.status, {"lastRestart", "reason"}), "PodRestarted");
    EXPECT_FALSE(Bool(plan.status, {"lastRestart", "wholeJob"}, true));
    Step(job, AllPods("Running"), kT0 + seconds(6 + 10 * i));
  }
  // ...so a failure only a whole restart could heal ends the job.
  JobPlan plan = Step(job, EveryWorkerLost(), kT0 + seconds(40));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_EQ(Condition(plan.status, "Failed", "reason"), "BackoffLimitExceeded");
}

TEST(JobRestartTest, EveryWorkerPodStoppedFromOutsideRestartsTheWholeJobUncounted) {
  for (const char* spec : {kRestartJob, kFailJob}) {
    Json job = ApiJob(spec);
    Step(job, AllPods("Running"), kT0);
    // A drained worker node pool: the worker pods are being deleted; scheduler and servers stay.
    std::vector<ObservedPod> pods = AllPods("Running");
    for (auto& p : pods) p.deleting = p.role == PodRole::kWorker;
    JobPlan plan = Step(job, pods, kT0 + seconds(5));
    EXPECT_EQ(Str(plan.status, {"phase"}), "Restarting") << spec;
    EXPECT_EQ(Sorted(plan.remove), (std::vector<std::string>{"mlp-scheduler", "mlp-server-0", "mlp-server-1"}));
    EXPECT_TRUE(plan.create.empty());
    EXPECT_EQ(Str(plan.status, {"lastRestart", "reason"}), "JobPreempted");
    EXPECT_TRUE(Bool(plan.status, {"lastRestart", "oldPodsGoing"}));
    EXPECT_EQ(Int(plan.status, {"restarts"}), 0) << "not counted toward backoffLimit";
    EXPECT_FALSE(At(plan.status, {"jobRestarts"}));
    plan = Step(job, Deleting(AllPods("Running")), kT0 + seconds(6));
    EXPECT_TRUE(plan.create.empty());
    plan = Step(job, {}, kT0 + seconds(9));
    EXPECT_EQ(Sorted(Names(plan.create)), kAllNames);
  }
}

// Where the pods' objects go before their processes (pods on no node; the test kubelet), the
// replacements exist before the last worker pod was seen going: the scheduler's word (the
// progress poller's StoppedFromOutside condition) restarts the whole job all the same.
TEST(JobRestartTest, TheSchedulerStoppingTheJobRestartsItEvenWhenTheReplacementsExist) {
  Json job = ApiJob(kFailJob);
  Step(job, AllPods("Running"), kT0);
  v1::JobProgress p;
  p.set_stopping(true);
  p.set_stop_reason("every worker's pod is being stopped from outside (deleted, evicted or drained)");
  Json status = job["status"];
  EXPECT_FALSE(ApplyStoppedFromOutside(status, p, /*suspended=*/true, kT0)) << "a suspend's stop is not this";
  EXPECT_FALSE(ApplyStoppedFromOutside(status, v1::JobProgress(), false, kT0));
  ASSERT_TRUE(ApplyStoppedFromOutside(status, p, false, kT0 + seconds(4)));
  EXPECT_FALSE(ApplyStoppedFromOutside(status, p, false, kT0 + seconds(5))) << "already True";
  EXPECT_EQ(Condition(status, "StoppedFromOutside", "reason"), "PodsStopped");
  job["status"] = status;

  JobPlan plan = Step(job, AllPods("Running"), kT0 + seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Restarting");
  EXPECT_EQ(Sorted(plan.remove), kAllNames);
  EXPECT_EQ(Str(plan.status, {"lastRestart", "reason"}), "JobPreempted");
  EXPECT_NE(Str(plan.status, {"lastRestart", "message"}).find("its scheduler stops the job as a whole"),
            std::string::npos);
  EXPECT_EQ(Condition(plan.status, "StoppedFromOutside"), "False") << "answered: the new run is not stopped";
  EXPECT_EQ(Int(plan.status, {"restarts"}), 0);
  Step(job, {}, kT0 + seconds(6));
  plan = Step(job, AllPods("Running"), kT0 + seconds(7));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Running");
  EXPECT_TRUE(plan.remove.empty()) << "one restart per stop";
}

TEST(JobRestartTest, SomeWorkerPodsStoppedFromOutsideAreRecreatedAlone) {
  Json job = ApiJob(kRestartJob);
  Step(job, AllPods("Running"), kT0);
  std::vector<ObservedPod> pods = AllPods("Running");
  pods[3].deleting = true;
  pods[4].deleting = true;
  JobPlan plan = Step(job, pods, kT0 + seconds(5));
  EXPECT_TRUE(plan.remove.empty()) << "the remaining worker keeps the model: its peers rejoin from it";
  EXPECT_EQ(Condition(plan.status, "Restarting", "reason"), "PodRecreated");
  EXPECT_FALSE(At(plan.status, {"lastRestart"}));
}

TEST(JobRestartTest, ASuspendWhileTheOldPodsGoClearsTheWait) {
  Json job = ApiJob(kRestartJob);
  Step(job, AllPods("Running"), kT0);
  Step(job, EveryWorkerLost(), kT0 + seconds(5));
  job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
  JobPlan plan = Step(job, Deleting(EveryWorkerLost()), kT0 + seconds(6));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Suspended");
  EXPECT_FALSE(Bool(plan.status, {"lastRestart", "oldPodsGoing"}));
  job["spec"]["runPolicy"]["suspend"] = Json::boolean(false);
  plan = Step(job, {}, kT0 + seconds(7));
  EXPECT_EQ(Sorted(Names(plan.create)), kAllNames);
}

}  // namespace
}  // namespace trellis::op
