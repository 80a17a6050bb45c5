// PlanJob's phases one at a time (operator/plan_phases.h): each reads a PlanRound and adds to
// its plan as its contract says. PlanJob as a whole is job_status*_test.cc's.
#include "operator/plan_phases.h"

#include <gtest/gtest.h>

#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using namespace testing;  // NOLINT: the job documents and pods shared by the plan's tests

std::vector<ObservedPod> Running() { return AllPods("Running"); }

TEST(DesiredPodListTest, SchedulerThenServersThenWorkersByRankAndTheObjectsFollowIt) {
  const Json job = ApiJob(kSpec);
  const JobSpec spec = Spec(job);
  const std::vector<DesiredPod> list = DesiredPodList("mlp", spec);
  EXPECT_EQ(Names(list), (std::vector<std::string>{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0",
                                                   "mlp-worker-1", "mlp-worker-2"}));
  EXPECT_EQ(list[4], (DesiredPod{"mlp-worker-1", PodRole::kWorker, 1}));
  const std::vector<Json> objects = DesiredPods(*JobMetaOf(job), spec, OperatorSettings{});
  ASSERT_EQ(objects.size(), list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    EXPECT_EQ(Str(objects[i], {"metadata", "name"}), list[i].name);
    EXPECT_EQ(Str(objects[i], {"metadata", "labels", kLabelRole}), RoleName(list[i].role));
  }
  EXPECT_EQ(GangSize(spec), 6);
}

TEST(ReadRestartsTest, ThePodsRestartsAreTheRolesLessItsProgramsAndClamped) {
  const Json status = *ParseJson(R"({"replicaStatuses":{
      "scheduler":{"restarts":1},"server":{"restarts":-5},
      "worker":{"restarts":7,"programRestarts":4}}})");
  const RestartCounts r = ReadRestarts(status);
  EXPECT_EQ(r.pods.at(PodRole::kScheduler), 1);
  EXPECT_EQ(r.pods.at(PodRole::kServer), 0);
  EXPECT_EQ(r.pods.at(PodRole::kWorker), 3);
  EXPECT_EQ(r.program.at(PodRole::kWorker), 4);
  EXPECT_EQ(r.PodTotal(), 4);
}

TEST(PlanPodsTest, CreatesTheMissingDeletesThoseBeyondTheReplicasAndNamesOneGoing) {
  const Json job = ApiJob(kSpec, R"({"phase":"Running"})");
  const JobSpec spec = Spec(job);
  std::vector<ObservedPod> pods = Running();
  pods.erase(pods.begin() + 1);  // server 0 is gone
  pods[3].deleting = true;       // worker 1 is being deleted
  pods.push_back(Pod(PodRole::kWorker, 3, "Running"));  // beyond the 3 replicas
  PlanRound r(job, spec, pods, kT0, nullptr);
  const PodsState state = PlanPods(r);
  EXPECT_TRUE(r.plan.ensure_support);
  EXPECT_EQ(Names(r.plan.create), (std::vector<std::string>{"mlp-server-0"}));
  EXPECT_EQ(r.plan.remove, (std::vector<std::string>{"mlp-worker-3"}));
  EXPECT_FALSE(state.all_up);
  EXPECT_EQ(state.going, "mlp-worker-1");  // recreated once gone, not deleted again

  DecidePhase(r, state);
  EXPECT_EQ(r.phase, kRestarting);
  EXPECT_EQ(r.reason, "PodRecreated");
}

TEST(PlanPodsTest, EveryPodUpIsRunning) {
  const Json job = ApiJob(kSpec);
  const JobSpec spec = Spec(job);
  const std::vector<ObservedPod> pods = Running();
  PlanRound r(job, spec, pods, kT0, nullptr);
  const PodsState state = PlanPods(r);
  EXPECT_TRUE(state.all_up);
  EXPECT_TRUE(r.plan.create.empty());
  DecidePhase(r, state);
  EXPECT_EQ(r.phase, kRunning);
  EXPECT_EQ(r.reason, "JobRunning");
}

TEST(DecideFailuresTest, AFailedWorkerIsReplacedAndCountedUntilBackoffLimit) {
  const Json job = ApiJob(kSpec, R"({"phase":"Running","replicaStatuses":{"worker":{"restarts":1}}})");
  const JobSpec spec = Spec(job);  // backoffLimit 2
  std::vector<ObservedPod> pods = Running();
  pods[4] = Pod(PodRole::kWorker, 1, "Failed", 3);
  PlanRound r(job, spec, pods, kT0, nullptr);
  DecideFailures(r);
  EXPECT_TRUE(r.phase.empty());
  EXPECT_TRUE(r.restarted);
  EXPECT_EQ(r.plan.remove, (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(r.restarts.pods.at(PodRole::kWorker), 2);
  ASSERT_EQ(r.plan.events.size(), 1u);
  EXPECT_EQ(r.plan.events[0].reason, "PodRestarted");
  EXPECT_EQ(Str(r.plan.status, {"firstFailure"}), "worker 1 (pod mlp-worker-1) failed with exit code 3");

  // The limit reached: the job fails, and nothing is replaced.
  const Json spent = ApiJob(kSpec, R"({"phase":"Running","replicaStatuses":{"worker":{"restarts":2}}})");
  PlanRound last(spent, spec, pods, kT0, nullptr);
  DecideFailures(last);
  EXPECT_EQ(last.phase, kFailed);
  EXPECT_EQ(last.reason, "BackoffLimitExceeded");
  EXPECT_TRUE(last.plan.remove.empty());
  EXPECT_EQ(Str(last.plan.status, {"completionTime"}), FormatTime(kT0));
}

TEST(FailLostPodsTest, OnlyARunningJobUnderNeverFailsForAPodGone) {
  const std::string never = R"({"workers":{"replicas":2,"command":["w"]},"runPolicy":{"restartPolicy":"Never"}})";
  const std::vector<ObservedPod> pods = {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                                         Pod(PodRole::kWorker, 0, "Running")};  // worker 1 is gone
  for (const char* phase : {"Running", "Pending"}) {
    const Json job = ApiJob(never, std::string(R"({"phase":")") + phase + "\"}");
    const JobSpec spec = Spec(job);
    PlanRound r(job, spec, pods, kT0, nullptr);
    FailLostPods(r);
    if (std::string(phase) == "Running") {
      EXPECT_EQ(r.phase, kFailed);
      EXPECT_EQ(r.reason, "PodDeleted");
      EXPECT_NE(r.message.find("worker 1 (pod mlp-worker-1) was deleted or evicted"), std::string::npos) << r.message;
    } else {
      EXPECT_TRUE(r.phase.empty());  // still starting: the pod is created
    }
  }
}

TEST(StartClockTest, TheDeadlineFailsTheJobOrIsLookedAtAgain) {
  const Json job = ApiJob(R"({"workers":{"command":["w"]},"runPolicy":{"activeDeadlineSeconds":60}})",
                          R"({"phase":"Running","startTime":")" + FormatTime(kT0) + "\"}");
  const JobSpec spec = Spec(job);
  const std::vector<ObservedPod> pods;
  PlanRound early(job, spec, pods, kT0 + std::chrono::seconds(20), nullptr);
  StartClock(early);
  EXPECT_TRUE(early.phase.empty());
  ASSERT_TRUE(early.plan.requeue_after);
  EXPECT_EQ(*early.plan.requeue_after, std::chrono::seconds(40));
  PlanRound late(job, spec, pods, kT0 + std::chrono::seconds(60), nullptr);
  StartClock(late);
  EXPECT_EQ(late.phase, kFailed);
  EXPECT_EQ(late.reason, "DeadlineExceeded");
}

TEST(HoldWithoutPodGroupTest, NoPodWithoutItsPodGroupAndTheConditionSaysWhy) {
  const Json job = ApiJob(kSpec);
  const JobSpec spec = Spec(job);
  const std::vector<ObservedPod> pods;
  GangObservation gang;
  gang.create_error = "cannot create PodGroup mlp: 404";
  PlanRound r(job, spec, pods, kT0, &gang);
  PodsState state = PlanPods(r);
  EXPECT_EQ(r.plan.create.size(), 6u);
  HoldWithoutPodGroup(r, state);
  EXPECT_TRUE(r.plan.create.empty());
  EXPECT_FALSE(state.all_up);
  const PodWaits waits = WhyPodsWait(r, state);
  EXPECT_EQ(waits.unschedulable.reason, "PodGroupNotCreated");
  EXPECT_EQ(waits.unschedulable.message, "job mlp: cannot create PodGroup mlp: 404");
  EXPECT_TRUE(waits.cannot_start.reason.empty());
}

TEST(EndJobTest, AnEndedJobCleansUpKeepsItsCountsAndWaitsForItsTtl) {
  const Json job = ApiJob(R"({"workers":{"replicas":1,"command":["w"]},"runPolicy":{"ttlSecondsAfterFinished":30}})",
                          R"({"phase":"Failed","completionTime":")" + FormatTime(kT0) +
                              R"(","replicaStatuses":{"worker":{"failed":1}}})");
  const JobSpec spec = Spec(job);
  const std::vector<ObservedPod> pods = {Pod(PodRole::kScheduler, 0, "Running")};
  PlanRound r(job, spec, pods, kT0 + std::chrono::seconds(10), nullptr);
  r.phase = r.old_phase;
  EndJob(r);
  EXPECT_EQ(r.plan.remove, (std::vector<std::string>{"mlp-scheduler"}));
  EXPECT_EQ(Int(r.plan.status, {"replicaStatuses", "worker", "failed"}), 1);
  EXPECT_EQ(Int(r.plan.status, {"replicaStatuses", "scheduler", "active"}), 0);
  ASSERT_TRUE(r.plan.requeue_after);
  EXPECT_EQ(*r.plan.requeue_after, std::chrono::seconds(20));
  EXPECT_TRUE(r.plan.event_type.empty());  // no new phase, no event
}

}  // namespace
}  // namespace trellis::op
