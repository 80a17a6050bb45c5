// A worker of an elastic job lost for good on Kubernetes (operator/elastic_resize.h
// NoteLostWorkers; docs/elastic.md#losing-a-worker): its pod failed and its agent said the job's
// scheduler left it out, so the job does not fail, no pod is made again for its slot, the loss
// is followed like a resize until the scheduler's world has a gap where it was, and the job
// succeeds with the others. The world it leaves runs on until the spec changes; a grow then
// brings the slot back.
#include <gtest/gtest.h>

#include "tests/unit/operator/elastic_testing.h"

namespace trellis::op {
namespace {

using namespace testing;  // NOLINT: the job documents and pods shared by the plan's tests

constexpr char kLost[] = "worker 1 (pod mlp-worker-1) failed: exit code 137 (killed by SIGKILL)";

// kSpec's pods with worker 1's program killed and its agent told it was lost.
std::vector<ObservedPod> Worker1Lost() {
  std::vector<ObservedPod> pods = AllPods("Running");
  pods[4].phase = "Failed";
  pods[4].exit_code = 137;
  pods[4].report.lost = kLost;
  return pods;
}

std::vector<int> Members(const Json& job) {
  std::vector<int> out;
  const Json* m = At(job, {"status", "world", "members"});
  if (!m || !m->is_array()) return out;
  for (const Json& e : m->as_array()) out.push_back(e.as_integer());
  return out;
}

// The scheduler's world after the loss took effect: a gap where worker 1 was.
void CloseTheGap(Json& job) {
  v1::JobProgress p;
  *p.mutable_world() = World(1, 40, {0, 2});
  std::vector<JobPlan::Event> events;
  ASSERT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  ASSERT_EQ(Members(job), (std::vector<int>{0, 2}));
}

// Workers 0 and 2 (pods[3] and pods[4] once worker 1's pod is gone from `pods`) end well: the
// job succeeds with the two.
void TheOthersSucceed(Json& job, std::vector<ObservedPod>& pods, Clock::time_point now) {
  pods[3].phase = pods[4].phase = "Succeeded";
  Round(job, pods, now);
  EXPECT_EQ(Str(job, {"status", "phase"}), kSucceeded);
  EXPECT_EQ(Condition(job["status"], "Succeeded", "message"), "job mlp: all 2 workers succeeded");
}

// A running 3-worker job under OnFailure whose worker 1's pod was deleted: the round after.
JobPlan Worker1DeletedUnderOnFailure(Json& job, std::vector<ObservedPod>& pods) {
  job["spec"]["runPolicy"]["restartPolicy"] = JStr("OnFailure");
  pods = AllPods("Running");
  Round(job, pods, kT0);
  pods.erase(pods.begin() + 4);
  return Round(job, pods, kT0 + std::chrono::seconds(1));
}

// A running 3-worker job whose worker 1 was lost, the scheduler's world {0, 2} taken effect.
void LostAndFollowed(Json& job, std::vector<ObservedPod>& pods) {
  pods = AllPods("Running");
  Round(job, pods, kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);
  pods = Worker1Lost();
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);
  ASSERT_TRUE(plan.follow_resize);
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  ASSERT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeDone);
}

TEST(ElasticLossTest, ALostWorkerDoesNotFailTheJobAndIsFollowedLikeAResize) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  EXPECT_EQ(Members(job), (std::vector<int>{0, 1, 2}));

  pods = Worker1Lost();
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty()) << "kept for its logs";
  EXPECT_FALSE(plan.resize) << "the scheduler made the resize itself";
  EXPECT_TRUE(plan.follow_resize);
  EXPECT_EQ(Reasons(plan.events), (std::vector<std::string>{"WorkerLost"}));
  EXPECT_NE(plan.events[0].message.find(std::string("is lost for good (") + kLost + "); the job goes on with 2 workers"),
            std::string::npos)
      << plan.events[0].message;
  const Json& st = job["status"];
  ASSERT_TRUE(At(st, {"world", "lost"})->is_array());
  const Json& lost = At(st, {"world", "lost"})->at(0);
  EXPECT_EQ(Int(lost, {"worker"}), 1);
  EXPECT_EQ(Str(lost, {"pod"}), "mlp-worker-1");
  EXPECT_EQ(Str(lost, {"reason"}), kLost);
  EXPECT_EQ(Str(st, {"lastResize", "outcome"}), kResizePending);
  EXPECT_EQ(Int(st, {"lastResize", "from"}), 3);
  EXPECT_EQ(Int(st, {"lastResize", "to"}), 2);
  EXPECT_EQ(Int(st, {"lastResize", "lostWorker"}), 1);
  EXPECT_EQ(Str(st, {"lastResize", "reason"}), "worker 1 lost");
  EXPECT_EQ(Condition(st, kResizingCondition), "True");
  EXPECT_EQ(Condition(st, kResizingCondition, "reason"), "WorkerLost");

  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_TRUE(plan.events.empty()) << "noted once";
  EXPECT_EQ(At(job, {"status", "world", "lost"})->size(), 1u);

  // The scheduler's world: a gap where worker 1 was.
  v1::JobProgress p;
  p.set_resize_pending_epoch(1);
  *p.mutable_world() = World(0, 0, 3);
  std::vector<JobPlan::Event> events;
  EXPECT_TRUE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "lastResize", "epoch"}), 1);
  p.set_resize_pending_epoch(0);
  *p.mutable_world() = World(1, 40, {0, 2});
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 2);
  EXPECT_EQ(Members(job), (std::vector<int>{0, 2}));
  EXPECT_EQ(At(job, {"status", "world", "lost"})->size(), 1u) << "still lost";
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeDone);
  EXPECT_EQ(Condition(job["status"], kResizingCondition, "reason"), "Resized");

  // The world of 2 runs on: worker 1's slot is not wanted, its pod stays, nothing is asked for.
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_FALSE(plan.resize) << "spec.workers.replicas 3 is not asked for again while the spec is unchanged";
  EXPECT_FALSE(plan.follow_resize);

  pods[3].phase = pods[5].phase = "Succeeded";
  Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(Str(job, {"status", "phase"}), kSucceeded);
  EXPECT_EQ(Condition(job["status"], "Succeeded", "message"), "job mlp: all 2 workers succeeded");
}

// Under OnFailure the agent restarts the program inside the pod until backoffLimit; out of
// restarts, the scheduler loses the worker: its pod is not recreated (it could not join the
// world), and nothing is counted toward backoffLimit.
TEST(ElasticLossTest, UnderOnFailureALostWorkersPodIsNotRecreated) {
  Json job = ApiJob(ElasticSpec(3));
  job["spec"]["runPolicy"]["restartPolicy"] = JStr("OnFailure");
  Round(job, AllPods("Running"), kT0);
  std::vector<ObservedPod> pods = Worker1Lost();
  pods[4].report.restarts = 2;
  const JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_TRUE(plan.create.empty());
  EXPECT_EQ(Reasons(plan.events), (std::vector<std::string>{"WorkerLost"}));
  EXPECT_EQ(Int(job, {"status", "restarts"}).value_or(0), 0);
}

// The operator saw the loss only after the scheduler's new world took effect (no epoch to wait
// for): the world without the lost one is the resize's end.
TEST(ElasticLossTest, ALossSeenAfterItsWorldTookEffectIsDoneAtOnce) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  pods = Worker1Lost();
  Round(job, pods, kT0 + std::chrono::seconds(1));
  v1::JobProgress p;
  *p.mutable_world() = World(1, 40, {0, 2});
  std::vector<JobPlan::Event> events;
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeDone);
  EXPECT_EQ(Members(job), (std::vector<int>{0, 2}));
}

// Too few would remain: the scheduler failed the job instead of losing the worker, its agent
// said so (job-failed), and the job fails naming spec.elastic.minWorkers.
TEST(ElasticLossTest, AFailureBelowMinWorkersFailsTheJobWithTheSchedulersWhy) {
  Json job = ApiJob(ElasticSpec(3));
  job["spec"]["elastic"]["minWorkers"] = Json::number(3);
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  pods[4].phase = "Failed";
  pods[4].exit_code = 137;
  pods[4].report.job_failed = std::string(kLost) +
                              "; the job cannot go on without it: 2 workers would remain, fewer than "
                              "spec.elastic.minWorkers (3)";
  Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kFailed);
  const std::string m = Condition(job["status"], "Failed", "message");
  EXPECT_NE(m.find("worker 1 (pod mlp-worker-1) failed with exit code 137 (restartPolicy Never)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("the job's scheduler failed the job: " + std::string(kLost)), std::string::npos) << m;
  EXPECT_NE(m.find("fewer than spec.elastic.minWorkers (3)"), std::string::npos) << m;
}

// A lost report on a job without spec.elastic cannot come from its scheduler: the failure is the
// job's, as before.
TEST(ElasticLossTest, WithoutElasticAFailedWorkerFailsTheJobAsBefore) {
  Json job = ApiJob(R"({"servers":{"replicas":2},"workers":{"replicas":3,"command":["trellis-mlp"]},
                        "runPolicy":{"restartPolicy":"Never"}})");
  Round(job, AllPods("Running"), kT0);
  Round(job, Worker1Lost(), kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kFailed);
  EXPECT_EQ(At(job, {"status", "world", "lost"}), nullptr);
}

// Growing back: a changed spec (a new generation) asks for 3 again; the scheduler brings slot 1
// back (the lowest free), so the lost pod is deleted and made again once gone, and the new world
// lists nobody lost.
TEST(ElasticLossTest, AChangedSpecGrowsTheLostSlotBack) {
  Json job = ApiJob(ElasticSpec(3));
  job["metadata"]["generation"] = Json::number(1);
  std::vector<ObservedPod> pods;
  ASSERT_NO_FATAL_FAILURE(LostAndFollowed(job, pods));

  // `kubectl scale --replicas=2` (the world: nothing to do), then 3.
  SetReplicas(job, 2);
  job["metadata"]["generation"] = Json::number(2);
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_FALSE(plan.resize);
  SetReplicas(job, 3);
  job["metadata"]["generation"] = Json::number(3);
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->from, 2);
  EXPECT_EQ(plan.resize->to, 3);
  std::vector<JobPlan::Event> events;
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(1, 2, 2), 0, kT0, &events));

  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-1"})) << "the lost pod goes to be made again";
  EXPECT_TRUE(plan.create.empty());
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  pods[4].deleting = true;
  plan = Round(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << "restartPolicy Never: the joiner's pod is not a pod lost";
  EXPECT_TRUE(plan.create.empty());
  pods.erase(pods.begin() + 4);
  plan = Round(job, pods, kT0 + std::chrono::seconds(6));
  EXPECT_EQ(Names(plan.create), (std::vector<std::string>{"mlp-worker-1"}));

  v1::JobProgress p;
  *p.mutable_world() = World(2, 90, 3);
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Members(job), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(At(job, {"status", "world", "lost"}), nullptr) << "brought back";
}

TEST(ElasticLossTest, WorldMembersFallBackToTheLowestSlotsWhenTheStatusHasNoneOrBadOnes) {
  EXPECT_TRUE(WorldMembers(*ParseJson("{}")).empty());
  EXPECT_EQ(WorldMembers(*ParseJson(R"({"world":{"workers":2}})")), (std::vector<int>{0, 1}));
  EXPECT_EQ(WorldMembers(*ParseJson(R"({"world":{"workers":2,"members":[0,2]}})")), (std::vector<int>{0, 2}));
  for (const char* bad : {R"([2,0])", R"([0,0])", R"([0])", R"([0,-1])", R"([0,"x"])", R"([0,1e9])", R"({"a":1})"}) {
    EXPECT_EQ(WorldMembers(*ParseJson(std::string(R"({"world":{"workers":2,"members":)") + bad + "}}")),
              (std::vector<int>{0, 1}))
        << bad;
  }
}

// A worker silent past registrationTimeoutSeconds (its node gone, its pod frozen): no pod failed,
// the scheduler's view lists it lost (silent). The progress poller notes it as NoteLoss does
// here; the reconciler follows the loss like a resize, and once the world has the gap it
// deletes the frozen pod (it would never finish) and makes none again; the job succeeds with
// the others.
TEST(ElasticLossTest, ASilentWorkerTheSchedulerLostIsFollowedAndItsPodDeleted) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  const std::string why = "worker 1 (pod mlp-worker-1) was silent for 65.0 s (no heartbeat from its agent)";
  const std::string m = NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", why, /*silent=*/true, 0, kT0);
  EXPECT_NE(m.find("worker 1 (pod mlp-worker-1) is lost for good (" + why + "); the job goes on with 2 workers"),
            std::string::npos)
      << m;
  EXPECT_EQ(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", why, true, 0, kT0), "") << "noted once";
  EXPECT_EQ(NoteLoss(job["status"], "mlp", 5, "mlp-worker-5", why, true, 0, kT0), "") << "not in the world";
  EXPECT_TRUE(LostSilently(job["status"], 1));
  EXPECT_FALSE(LostSilently(job["status"], 0));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);
  EXPECT_EQ(Int(job, {"status", "lastResize", "lostWorker"}), 1);

  // Its pod still runs (frozen): wanted while the world has it, the loss followed.
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.follow_resize);
  EXPECT_TRUE(plan.remove.empty());
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  EXPECT_TRUE(LostSilently(job["status"], 1)) << "still listed";

  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_FALSE(plan.resize);
  pods[4].deleting = true;
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_TRUE(plan.create.empty()) << "no pod is made again for it";
  pods.erase(pods.begin() + 4);
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_TRUE(plan.create.empty());
  TheOthersSucceed(job, pods, kT0 + std::chrono::seconds(5));
}

// A worker lost by its own failure: its pod is kept while it turns Failed, for its logs (only a
// silent loss's pod is deleted).
TEST(ElasticLossTest, AWorkerLostByItsFailureKeepsItsPod) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  EXPECT_NE(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", kLost, /*silent=*/false, 0, kT0), "");
  EXPECT_FALSE(LostSilently(job["status"], 1));
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  // Its pod has not turned Failed yet (its agent is writing the report): not deleted.
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_TRUE(plan.remove.empty());
}

// A worker pod deleted under restartPolicy Never (a spot node reclaimed, a drain, `kubectl
// delete pod`): no replacement comes, so the operator neither fails the job nor makes the pod
// again; the job stays Running while its scheduler loses the worker (its agent reported the
// stop), the progress poller notes the loss and the world closes the gap; the job succeeds with
// the others.
TEST(ElasticLossTest, AWorkerPodDeletedUnderNeverIsNotMadeAgainAndTheJobGoesOn) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

  pods[4].deleting = true;
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  pods.erase(pods.begin() + 4);
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << "not Restarting: nothing is recreated";
  EXPECT_TRUE(plan.create.empty()) << "restartPolicy Never: no pod is made again";

  // The scheduler's view lists the loss; the poller notes it, the world closes the gap.
  const std::string why = "worker 1 (pod mlp-worker-1) failed: exit code 143 (killed by SIGTERM): program killed by "
                          "signal 15 after the agent got SIGTERM (the pod was deleted, evicted or drained)";
  EXPECT_NE(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", why, /*silent=*/false, 0, kT0), "");
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  TheOthersSucceed(job, pods, kT0 + std::chrono::seconds(4));
}

// Evicted for node pressure (the pod stays, Failed with reason Evicted): the same, and once the
// world has the gap its pod is deleted like any departed worker's that ended.
TEST(ElasticLossTest, AWorkerPodEvictedUnderNeverIsLostNotFailed) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  pods[4].phase = "Failed";
  pods[4].exit_code = 143;
  pods[4].disruption = "Evicted";
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_TRUE(plan.events.empty());
  EXPECT_NE(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", "evicted", /*silent=*/false, 0, kT0), "");
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_TRUE(plan.create.empty());

  // With minWorkers 3 the eviction fails the job, as without spec.elastic.
  Json few = ApiJob(ElasticSpec(3));
  few["spec"]["elastic"]["minWorkers"] = Json::number(3);
  pods = AllPods("Running");
  Round(few, pods, kT0);
  pods[4].phase = "Failed";
  pods[4].disruption = "Evicted";
  Round(few, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(few, {"status", "phase"}), kFailed);
  EXPECT_EQ(Condition(few["status"], "Failed", "reason"), "PodDeleted");
}

// The others may finish before the loss is followed (a deletion near the end): the deleted
// worker is not waited for.
TEST(ElasticLossTest, TheOthersFinishingBeforeTheLossIsFollowedSucceedTheJob) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  pods.erase(pods.begin() + 4);
  TheOthersSucceed(job, pods, kT0 + std::chrono::seconds(1));
}

// Fewer than minWorkers would be left: the job fails at once, naming the deletion and the bound.
TEST(ElasticLossTest, AWorkerPodDeletedBelowMinWorkersFailsTheJobSayingSo) {
  Json job = ApiJob(ElasticSpec(3));
  job["spec"]["elastic"]["minWorkers"] = Json::number(3);
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  pods[4].deleting = true;
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(job, {"status", "phase"}), kFailed);
  EXPECT_EQ(Condition(job["status"], "Failed", "reason"), "PodDeleted");
  EXPECT_EQ(Condition(job["status"], "Failed", "message"),
            "job mlp: worker 1 (pod mlp-worker-1) was deleted or evicted while the job ran (restartPolicy Never "
            "does not replace it), and 2 worker(s) are left, fewer than spec.elastic.minWorkers (3)");
  EXPECT_TRUE(plan.create.empty());
}

// Under OnFailure a deleted worker pod is made again (its replacement rejoins under its rank),
// elastic or not; and a server deleted under Never still fails an elastic job (servers are not
// elastic).
TEST(ElasticLossTest, OnlyNeverWorkersAreGoneForGood) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods;
  JobPlan plan = Worker1DeletedUnderOnFailure(job, pods);
  EXPECT_EQ(Names(plan.create), (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRestarting);

  Json never = ApiJob(ElasticSpec(3));
  pods = AllPods("Running");
  Round(never, pods, kT0);
  pods.erase(pods.begin() + 2);  // server 1
  Round(never, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(never, {"status", "phase"}), kFailed);
  EXPECT_EQ(Condition(never["status"], "Failed", "reason"), "PodDeleted");
}

// A late replacement (restartPolicy OnFailure): worker 1's pod deleted, made again, and left
// Pending (no node) past registrationTimeoutSeconds, so the scheduler lost the worker. The
// Pending pod is kept; once it runs, its program asks to join and the scheduler grows the world
// back on its own; the poller notes that grow (NoteSchedulersGrow) and the reconciler follows it
// to a world of 3 with nobody lost.
TEST(ElasticLossTest, ALateReplacementIsKeptAndTheSchedulersGrowBackFollowed) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods;
  JobPlan plan = Worker1DeletedUnderOnFailure(job, pods);
  ASSERT_EQ(Names(plan.create), (std::vector<std::string>{"mlp-worker-1"}));
  pods.insert(pods.begin() + 4, Pod(PodRole::kWorker, 1, "Pending"));
  EXPECT_NE(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1",
                     "worker 1 (pod mlp-worker-1) was stopped from outside (pod deleted or evicted) and no "
                     "replacement pod registered within 5 s",
                     /*silent=*/false, 0, kT0),
            "");
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << "the world of 2 is up";
  EXPECT_TRUE(plan.remove.empty()) << "the replacement waits for a node";
  EXPECT_TRUE(plan.create.empty());
  EXPECT_FALSE(plan.resize);

  // Its program asked to join: the scheduler's grow back, noted by the poller.
  pods[4].phase = "Running";
  v1::JobProgress p;
  *p.mutable_world() = World(1, 40, {0, 2});
  p.set_resize_pending_epoch(2);
  for (int m : {0, 1, 2}) p.add_resize_pending_members(m);
  std::optional<JobPlan::Event> e = NoteSchedulersGrow(job["status"], "mlp", p, kT0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, "WorkerBack");
  EXPECT_EQ(e->message,
            "job mlp: worker 1 came back after it was lost (its pod's program asked to join); resize from 2 workers "
            "to 3, at a step boundary the workers agree on");
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);
  EXPECT_EQ(Int(job, {"status", "lastResize", "to"}), 3);
  EXPECT_FALSE(NoteSchedulersGrow(job["status"], "mlp", p, kT0).has_value()) << "followed already";
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_TRUE(plan.follow_resize);
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_TRUE(plan.create.empty());
  EXPECT_FALSE(plan.resize);
  p.set_resize_pending_epoch(0);
  *p.mutable_world() = World(2, 90, 3);
  std::vector<JobPlan::Event> events;
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Members(job), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(At(job, {"status", "world", "lost"}), nullptr) << "back";
  for (int w : {3, 4, 5}) pods[w].phase = "Succeeded";
  Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(Condition(job["status"], "Succeeded", "message"), "job mlp: all 3 workers succeeded");
}

// The grow back decided between two polls: the world it made is written at once, Done.
TEST(ElasticLossTest, AGrowBackDecidedBetweenTwoPollsIsWrittenDone) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods;
  ASSERT_NO_FATAL_FAILURE(LostAndFollowed(job, pods));
  v1::JobProgress p;
  *p.mutable_world() = World(2, 90, 3);
  p.mutable_last_resize()->set_epoch(2);
  std::optional<JobPlan::Event> e = NoteSchedulersGrow(job["status"], "mlp", p, kT0);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->reason, "Resized");
  EXPECT_EQ(Members(job), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeDone);
  EXPECT_EQ(Int(job, {"status", "lastResize", "fromStep"}), 90);
  EXPECT_EQ(At(job, {"status", "world", "lost"}), nullptr);

  // A resize that brings nobody lost back is not the scheduler's grow back: not noted here.
  Json other = ApiJob(ElasticSpec(2));
  Round(other, AllPods("Running"), kT0);
  p.set_resize_pending_epoch(1);
  for (int m : {0, 1, 2}) p.add_resize_pending_members(m);
  EXPECT_FALSE(NoteSchedulersGrow(other["status"], "mlp", p, kT0).has_value());
}

// A silent worker (its node gone) under OnFailure: its frozen pod is deleted (its uid noted), and
// once it is gone a replacement is made under the same name -- on another node, it runs, its
// program asks to join, and the scheduler grows the world back. Neither holds the job back.
TEST(ElasticLossTest, UnderOnFailureASilentWorkersDeletedPodIsReplacedAndGrowsBack) {
  Json job = ApiJob(ElasticSpec(3));
  job["spec"]["runPolicy"]["restartPolicy"] = JStr("OnFailure");
  std::vector<ObservedPod> pods = AllPods("Running");
  pods[4].uid = "frozen";
  Round(job, pods, kT0);
  EXPECT_NE(NoteLoss(job["status"], "mlp", 1, "mlp-worker-1", "silent", /*silent=*/true, 0, kT0), "");
  ASSERT_NO_FATAL_FAILURE(CloseTheGap(job));
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_EQ(DeletedSilentPod(job["status"], 1), "frozen");
  pods[4].deleting = true;  // a node really gone keeps it Terminating until the node object goes
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_TRUE(plan.create.empty()) << "the same name: once the frozen pod is gone";
  pods.erase(pods.begin() + 4);
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Names(plan.create), (std::vector<std::string>{"mlp-worker-1"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << "a replacement is not a pod the job waits for";
  pods.insert(pods.begin() + 4, Pod(PodRole::kWorker, 1, "Pending"));
  pods[4].uid = "replacement";
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty()) << "the replacement is kept";
  pods[4].phase = "Running";
  plan = Round(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_TRUE(plan.remove.empty());
  // Had it stayed out and ended, it would be kept too: not made again and again.
  pods[4].phase = "Succeeded";
  plan = Round(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_TRUE(plan.create.empty());
  pods[4].phase = "Running";

  v1::JobProgress p;
  *p.mutable_world() = World(2, 90, 3);
  p.mutable_last_resize()->set_epoch(2);
  ASSERT_TRUE(NoteSchedulersGrow(job["status"], "mlp", p, kT0).has_value());
  EXPECT_EQ(Members(job), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(At(job, {"status", "world", "lost"}), nullptr);
  plan = Round(job, pods, kT0 + std::chrono::seconds(6));
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_TRUE(plan.create.empty());
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
}

}  // namespace
}  // namespace trellis::op
