// An elastic job resized on Kubernetes (operator/elastic_resize.h): the plan follows the world
// the scheduler runs with, asks for a resize when spec.workers.replicas differs from it, keeps a
// worker resized away until it has ended, and the status says where each resize stands.
#include "operator/elastic_resize.h"

#include <gtest/gtest.h>

#include "operator/plan_phases.h"
#include "tests/unit/operator/elastic_testing.h"

namespace trellis::op {
namespace {

using namespace testing;  // NOLINT: the job documents and pods shared by the plan's tests

// A running 3-worker job scaled to 2, the scheduler having taken the resize (epoch 1, Pending).
void ScaledTo2AndPending(Json& job, const std::vector<ObservedPod>& pods) {
  Round(job, pods, kT0);
  SetReplicas(job, 2);
  const JobPlan plan = Round(job, pods, kT0);
  ASSERT_TRUE(plan.resize);
  std::vector<JobPlan::Event> events;
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(0, 3, 1), 0, kT0, &events));
  ASSERT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);
}

TEST(ElasticResizeTest, TheFirstRoundWritesTheWorldForEveryJob) {
  for (const std::string& spec : {ElasticSpec(3), std::string(kSpec)}) {
    Json job = ApiJob(spec);
    const JobPlan plan = Round(job, {}, kT0);
    EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);
    EXPECT_EQ(Int(job, {"status", "world", "epoch"}), 0);
    EXPECT_FALSE(plan.resize);
  }
}

// `kubectl scale` on a running job without spec.elastic: its scheduler cannot take or lose
// workers, so the pods stay as they are and the job says why, once; the new size applies when
// the job is resumed after a suspension.
TEST(ElasticResizeTest, AJobWithoutElasticKeepsItsSizeWhileItRunsAndTakesTheNewOneWhenResumed) {
  for (const int asked : {2, 5}) {
    Json job = ApiJob(kSpec);
    std::vector<ObservedPod> pods = AllPods("Running");
    Round(job, pods, kT0);
    ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

    SetReplicas(job, asked);
    JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
    EXPECT_FALSE(plan.resize);
    EXPECT_TRUE(plan.create.empty()) << asked;
    EXPECT_TRUE(plan.remove.empty()) << asked;
    EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
    EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);
    EXPECT_EQ(Reasons(plan.events), (std::vector<std::string>{"ResizeRefused"}));
    EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeRefused);
    EXPECT_NE(Str(job, {"status", "lastResize", "message"}).find("no spec.elastic"), std::string::npos);
    plan = Round(job, pods, kT0 + std::chrono::seconds(2));
    EXPECT_TRUE(plan.events.empty()) << "said once";

    job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
    Round(job, pods, kT0 + std::chrono::seconds(3));
    ASSERT_EQ(Str(job, {"status", "phase"}), kSuspended);
    Round(job, {}, kT0 + std::chrono::seconds(4));  // the pods are gone
    job["spec"]["runPolicy"]["suspend"] = Json::boolean(false);
    plan = Round(job, {}, kT0 + std::chrono::seconds(5));
    int workers = 0;
    for (const DesiredPod& d : plan.create) workers += d.role == PodRole::kWorker;
    EXPECT_EQ(workers, asked);
    EXPECT_EQ(Int(job, {"status", "world", "workers"}), asked);
    for (const std::string& reason : Reasons(plan.events)) EXPECT_NE(reason, "ResizeRefused");
  }
}

// spec.servers.replicas edited on a running job without spec.elastic's server bounds (elastic
// workers or not): its servers are not resized, so no server pod is made or deleted (a new one
// would have no rank at the scheduler, a removed one holds shards); the job says why, once, runs
// on, and starts with the new count when resumed.
TEST(ElasticResizeTest, ServersAreNotResizedWhileTheJobRunsTheNewCountAppliesWhenResumed) {
  for (const std::string& spec : {ElasticSpec(3), std::string(kSpec)}) {
    for (const int asked : {1, 3}) {
      Json job = ApiJob(spec);
      std::vector<ObservedPod> pods = AllPods("Running");
      Round(job, pods, kT0);
      ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);
      EXPECT_EQ(Int(job, {"status", "world", "servers"}), 2);

      job["spec"]["servers"]["replicas"] = Json::number(asked);
      JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
      EXPECT_TRUE(plan.create.empty()) << asked;
      EXPECT_TRUE(plan.remove.empty()) << asked;
      EXPECT_FALSE(plan.resize);
      EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
      EXPECT_EQ(Reasons(plan.events), (std::vector<std::string>{"ResizeRefused"}));
      EXPECT_EQ(plan.events[0].message,
                "job mlp: spec.servers.replicas is " + std::to_string(asked) +
                    ", but a running job's parameter servers are resized only within spec.elastic.minServers and "
                    "maxServers, which it does not set; it keeps running with 2 servers, "
                    "and the new count applies when it next starts (suspend and resume it: "
                    "spec.runPolicy.suspend), see docs/elastic.md");
      EXPECT_EQ(Condition(job["status"], kResizingCondition, "reason"), "ServersNotResized");
      plan = Round(job, pods, kT0 + std::chrono::seconds(2));
      EXPECT_TRUE(plan.events.empty()) << "said once";
      EXPECT_EQ(Int(job, {"status", "world", "servers"}), 2);

      job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
      Round(job, pods, kT0 + std::chrono::seconds(3));
      ASSERT_EQ(Str(job, {"status", "phase"}), kSuspended);
      Round(job, {}, kT0 + std::chrono::seconds(4));
      job["spec"]["runPolicy"]["suspend"] = Json::boolean(false);
      plan = Round(job, {}, kT0 + std::chrono::seconds(5));
      int servers = 0;
      for (const DesiredPod& d : plan.create) servers += d.role == PodRole::kServer;
      EXPECT_EQ(servers, asked);
      EXPECT_EQ(Int(job, {"status", "world", "servers"}), asked);
      EXPECT_EQ(At(job, {"status", "world", "serversAsked"}), nullptr);
    }
  }
}

// With spec.elastic.minServers/maxServers (docs/elastic.md#servers) a changed
// spec.servers.replicas is asked of the scheduler once the workers are as asked (one kind at a
// time); a grow's added server pod is made once the scheduler took it; status.world.servers
// follows the scheduler's world; a server a shrink removed is kept until it exited by itself;
// a count outside the bounds is refused on the job, once.
TEST(ElasticResizeTest, ElasticServersAreResizedWithinTheirBoundsOneKindAtATime) {
  Json job = ApiJob(R"({"servers":{"replicas":2},
                        "workers":{"replicas":3,"command":["trellis-mlp"]},
                        "elastic":{"minWorkers":1,"maxWorkers":3,"minServers":1,"maxServers":3},
                        "runPolicy":{"restartPolicy":"Never"}})");
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

  // Workers and servers changed together: the workers first.
  SetReplicas(job, 2);
  job["spec"]["servers"]["replicas"] = Json::number(3);
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_TRUE(plan.resize);
  EXPECT_FALSE(plan.resize->servers);
  EXPECT_TRUE(plan.events.empty()) << "the servers' ask is not refused: it waits its turn";
  SetReplicas(job, 3);

  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  ASSERT_TRUE(plan.resize);
  EXPECT_TRUE(plan.resize->servers);
  EXPECT_EQ(plan.resize->from, 2);
  EXPECT_EQ(plan.resize->to, 3);
  EXPECT_EQ(plan.resize->reason, "spec.servers.replicas is 3");
  EXPECT_TRUE(plan.create.empty()) << "no server pod before the scheduler took the resize";
  std::vector<JobPlan::Event> events;
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(0, 3, 1), 0, kT0, &events));
  EXPECT_EQ(Str(job, {"status", "lastResize", "kind"}), kServersResize);
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);
  ASSERT_EQ(Reasons(events), (std::vector<std::string>{"ResizeRequested"}));
  EXPECT_NE(events[0].message.find("resize from 2 servers to 3 (spec.servers.replicas is 3); once the servers added "
                                   "are ready"),
            std::string::npos)
      << events[0].message;

  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_TRUE(plan.follow_resize) << job["status"].serialize();
  ASSERT_EQ(plan.create.size(), 1u);
  EXPECT_EQ(plan.create[0].name, "mlp-server-2");
  pods.push_back(Pod(PodRole::kServer, 2, "Running"));
  v1::JobProgress p;
  *p.mutable_world() = World(1, 40, 3);
  p.mutable_world()->set_servers(3);
  events.clear();
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "world", "servers"}), 3);
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);
  ASSERT_EQ(Reasons(events), (std::vector<std::string>{"Resized"}));
  EXPECT_NE(events[0].message.find("from 2 servers to 3"), std::string::npos) << events[0].message;
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_FALSE(plan.resize) << "the world is as asked";

  // 3 -> 1: the servers removed keep running until they handed their slices over and exited.
  job["spec"]["servers"]["replicas"] = Json::number(1);
  plan = Round(job, pods, kT0 + std::chrono::seconds(5));
  ASSERT_TRUE(plan.resize && plan.resize->servers);
  EXPECT_EQ(plan.resize->to, 1);
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(1, 3, 2), 0, kT0, &events));
  *p.mutable_world() = World(2, 60, 3);
  p.mutable_world()->set_servers(1);
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "world", "servers"}), 1);
  plan = Round(job, pods, kT0 + std::chrono::seconds(6));
  EXPECT_TRUE(plan.remove.empty()) << "servers 1 and 2 hand their slices over first";
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  for (auto& s : pods) {
    if (s.role == PodRole::kServer && s.index > 0) {
      s.phase = "Succeeded";
      s.exit_code = 0;
    }
  }
  plan = Round(job, pods, kT0 + std::chrono::seconds(7));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-server-1", "mlp-server-2"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << "a server resized away is no failure";

  // Outside the bounds: refused on the job (the spec as it stands does not parse), said once.
  job["spec"]["servers"]["replicas"] = Json::number(4);
  plan = Round(job, pods, kT0 + std::chrono::seconds(8));
  EXPECT_FALSE(plan.resize);
  ASSERT_EQ(Reasons(plan.events), (std::vector<std::string>{"ResizeRefused"}));
  EXPECT_NE(plan.events[0].message.find("spec.servers.replicas is 4, outside spec.elastic [1, 3] (minServers, "
                                        "maxServers); it keeps running with 1 server"),
            std::string::npos)
      << plan.events[0].message;
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  plan = Round(job, pods, kT0 + std::chrono::seconds(9));
  EXPECT_TRUE(plan.events.empty()) << "said once";
}

// A server pod a grow adds that fails before the grow took effect (restartPolicy Never) is not
// the job's failure: the scheduler gives the grow up, and the pod goes once it is Abandoned.
TEST(ElasticResizeTest, AServerAGrowAddsThatFailsGivesTheGrowUpNotTheJob) {
  Json job = ApiJob(R"({"servers":{"replicas":2},
                        "workers":{"replicas":3,"command":["trellis-mlp"]},
                        "elastic":{"minWorkers":1,"maxWorkers":3,"minServers":1,"maxServers":3},
                        "runPolicy":{"restartPolicy":"Never"}})");
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  job["spec"]["servers"]["replicas"] = Json::number(3);
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_TRUE(plan.resize && plan.resize->servers);
  std::vector<JobPlan::Event> events;
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(0, 3, 1), 0, kT0, &events));
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  ASSERT_EQ(plan.create.size(), 1u);
  pods.push_back(Pod(PodRole::kServer, 2, "Failed", 1));
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << job["status"].serialize();
  EXPECT_TRUE(plan.create.empty()) << "not made again under Never";

  // The scheduler gave the grow up: Abandoned, the failed pod deleted, the job runs on with 2.
  v1::JobProgress p;
  *p.mutable_world() = World(0, 1, 3);
  events.clear();
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeAbandoned);
  ASSERT_EQ(Reasons(events), (std::vector<std::string>{"ResizeAbandoned"}));
  EXPECT_NE(events[0].message.find("the resize from 2 servers to 3 was given up"), std::string::npos)
      << events[0].message;
  EXPECT_NE(events[0].message.find("the job runs on with 2 servers; change spec.servers.replicas to ask again"),
            std::string::npos)
      << events[0].message;
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-server-2"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_FALSE(plan.resize) << "not asked again until the replicas change";
}

// In update mode the refusal says what a resume with another count would meet.
TEST(ElasticResizeTest, InUpdateModeTheServersRefusalSaysTheCheckpointsHoldTheShards) {
  Json job = ApiJob(kSpec);
  job["spec"]["serverMode"] = JStr("update");
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  job["spec"]["servers"]["replicas"] = Json::number(3);
  const JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_EQ(plan.events.size(), 1u);
  EXPECT_NE(plan.events[0].message.find("in serverMode update its checkpoints hold the servers' shards, which another "
                                        "count cannot restore"),
            std::string::npos)
      << plan.events[0].message;
}

// Growing back on Kubernetes: a job shrunk to 2 scaled to 3 again. The pod of the worker that
// joins is created only once the scheduler took the resize (it waits for the joiner), and the
// world turns 3 once the workers switched.
TEST(ElasticResizeTest, AScaleUpGrowsBackCreatingTheJoinersPodOnceTheSchedulerTookIt) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  ASSERT_NO_FATAL_FAILURE(ScaledTo2AndPending(job, pods));
  std::vector<JobPlan::Event> events;
  v1::JobProgress p;
  *p.mutable_world() = World(1, 40, 2);
  ASSERT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  pods.back().phase = "Succeeded";  // worker 2 left: its pod is deleted
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-2"}));
  pods.pop_back();
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);
  ASSERT_TRUE(plan.create.empty());

  SetReplicas(job, 3);
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->to, 3);
  EXPECT_TRUE(plan.create.empty()) << "no pod before the scheduler took it";
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(1, 2, 2), 0, kT0, &events));
  ASSERT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);

  // restartPolicy Never: the missing pod is the joiner's, made now, not a pod lost.
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  ASSERT_EQ(plan.create.size(), 1u);
  EXPECT_EQ(plan.create[0].name, "mlp-worker-2");
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 2) << "not before the workers switched";

  *p.mutable_world() = World(2, 70, 3);
  ASSERT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);
  pods = AllPods("Running");
  plan = Round(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_FALSE(plan.resize);
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
}

// A grow the scheduler gave up (its joiner never asked to join: its pod was never scheduled):
// the world stays, and the joiner's pod that never started is deleted; one that runs is kept
// until it ended (its program is told it is not wanted and exits 0).
TEST(ElasticResizeTest, AGrowGivenUpDeletesTheJoinersPodThatNeverStarted) {
  for (const char* joiner_phase : {"Pending", "Running"}) {
    Json job = ApiJob(ElasticSpec(3));
    std::vector<ObservedPod> pods = AllPods("Running");
    pods.pop_back();
    Round(job, pods, kT0);
    job["status"]["world"]["workers"] = Json::number(2);
    SetReplicas(job, 2);
    Round(job, pods, kT0);
    SetReplicas(job, 3);
    JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
    ASSERT_TRUE(plan.resize);
    std::vector<JobPlan::Event> events;
    ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(1, 2, 2), 0, kT0, &events));
    plan = Round(job, pods, kT0 + std::chrono::seconds(2));
    ASSERT_EQ(plan.create.size(), 1u);
    pods.push_back(Pod(PodRole::kWorker, 2, joiner_phase));

    v1::JobProgress p;  // given up: nothing under way, the world unchanged
    *p.mutable_world() = World(1, 40, 2);
    ASSERT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
    ASSERT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeAbandoned);
    plan = Round(job, pods, kT0 + std::chrono::seconds(3));
    EXPECT_EQ(Str(job, {"status", "phase"}), kRunning) << joiner_phase;
    EXPECT_TRUE(plan.create.empty()) << joiner_phase;
    if (std::string(joiner_phase) == "Pending") {
      EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-2"}));
    } else {
      EXPECT_TRUE(plan.remove.empty()) << "kept until it ended";
    }
  }
}

// `kubectl scale --replicas=2` on a running 3-worker job, through to its end.
TEST(ElasticResizeTest, AScaleDownIsAskedOnceFollowedAndTheWorkerResizedAwayIsDeletedOnceItExited) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  Round(job, pods, kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

  SetReplicas(job, 2);
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->from, 3);
  EXPECT_EQ(plan.resize->to, 2);
  EXPECT_TRUE(plan.remove.empty()) << "no pod goes before the workers agreed on a step";
  EXPECT_TRUE(plan.create.empty());

  // The scheduler takes it (epoch 1): Pending, the Resizing condition True.
  std::vector<JobPlan::Event> events;
  ASSERT_TRUE(ApplyResizeAnswer(job["status"], "mlp", *plan.resize, Answer(0, 3, 1), 0, kT0, &events));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizePending);
  EXPECT_EQ(Int(job, {"status", "lastResize", "epoch"}), 1);
  EXPECT_EQ(Condition(job["status"], kResizingCondition), "True");
  EXPECT_EQ(Reasons(events), (std::vector<std::string>{"ResizeRequested"}));

  // Next rounds follow it and ask nothing again; the world is still 3 workers.
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_FALSE(plan.resize);
  EXPECT_TRUE(plan.follow_resize);
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);
  v1::JobProgress p;
  p.set_resize_pending_epoch(1);
  *p.mutable_world() = World(0, 0, 3);
  events.clear();
  EXPECT_TRUE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_TRUE(events.empty());

  // The workers switched at step 40: the world is 2, Resized.
  p.set_resize_pending_epoch(0);
  *p.mutable_world() = World(1, 40, 2);
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 2);
  EXPECT_EQ(Int(job, {"status", "world", "fromStep"}), 40);
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeDone);
  EXPECT_EQ(Condition(job["status"], kResizingCondition), "False");
  EXPECT_EQ(Condition(job["status"], kResizingCondition, "reason"), "Resized");
  ASSERT_EQ(Reasons(events), (std::vector<std::string>{"Resized"}));
  EXPECT_NE(events[0].message.find("from 3 workers to 2; the new world trains from step 40"), std::string::npos)
      << events[0].message;

  // Worker 2 finishes its last step: kept while it runs, the job Running with 2 workers.
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_FALSE(plan.resize);
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_EQ(Str(job, {"status", "workers"}).substr(2), "2");  // "<up>/2"

  // It exited 0: its pod is deleted, the job is not done (its own 2 workers still train).
  pods.back().phase = "Succeeded";
  pods.back().exit_code = 0;
  plan = Round(job, pods, kT0 + std::chrono::seconds(4));
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-2"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  pods.pop_back();

  for (auto& w : pods) {
    if (w.role == PodRole::kWorker) w.phase = "Succeeded";
  }
  Round(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(job, {"status", "phase"}), kSucceeded);
}

// A worker resized away that fails on its way out is deleted, not replaced, and the job
// (restartPolicy Never) does not fail for it.
TEST(ElasticResizeTest, AWorkerResizedAwayThatFailsIsNotTheJobsFailure) {
  Json job = ApiJob(ElasticSpec(2), R"({"phase":"Running","world":{"workers":2,"epoch":1}})");
  std::vector<ObservedPod> pods = AllPods("Running");
  pods.back().phase = "Failed";  // worker 2, outside the world of 2
  pods.back().exit_code = 1;
  const JobPlan plan = Round(job, pods, kT0);
  EXPECT_EQ(plan.remove, (std::vector<std::string>{"mlp-worker-2"}));
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
}

TEST(ElasticResizeTest, OutsideTheBoundsIsRefusedOnceOnTheJobWhichRunsOn) {
  Json job = ApiJob(ElasticSpec(2));
  std::vector<ObservedPod> pods = AllPods("Running");
  pods.pop_back();  // 2 workers
  Round(job, pods, kT0);
  ASSERT_EQ(Str(job, {"status", "phase"}), kRunning);

  SetReplicas(job, 5);  // maxWorkers is 3: ParseJobSpec refuses the job as it stands
  ASSERT_FALSE(ParseJobSpec(job.serialize()).ok());
  JobPlan plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_FALSE(plan.resize);
  EXPECT_EQ(Str(job, {"status", "phase"}), kRunning);
  EXPECT_TRUE(plan.create.empty());
  EXPECT_TRUE(plan.remove.empty());
  EXPECT_EQ(Reasons(plan.events), (std::vector<std::string>{"ResizeRefused"}));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeRefused);
  EXPECT_NE(Str(job, {"status", "lastResize", "message"}).find("outside spec.elastic [1, 3]"), std::string::npos);
  EXPECT_EQ(Condition(job["status"], kResizingCondition, "reason"), "ResizeRefused");

  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  EXPECT_TRUE(plan.events.empty()) << "said once";

  // Another replicas that fits is asked.
  SetReplicas(job, 1);
  plan = Round(job, pods, kT0 + std::chrono::seconds(3));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->to, 1);

  // A job whose spec is wrong elsewhere still fails as before.
  Json bad = job;
  SetReplicas(bad, 5);
  bad["spec"]["sliceBytes"] = Json::number(1);
  EXPECT_FALSE(ParseAtWorldReplicas(bad, InvalidArgumentError("x")).ok());
}

TEST(ElasticResizeTest, TheSchedulersAnswersRefusalUnderWayAndUnreachable) {
  const ResizeAsk grow{2, 3, "spec.workers.replicas is 3"};
  Json st = *ParseJson(R"({"phase":"Running","world":{"workers":2,"epoch":0}})");
  std::vector<JobPlan::Event> events;

  // Not reached: nothing written, asked again later.
  const Json before = st;
  EXPECT_FALSE(ApplyResizeAnswer(st, "mlp", grow, UnavailableError("connection refused"), 0, kT0, &events));
  EXPECT_EQ(st, before);
  EXPECT_TRUE(events.empty());

  // Growing is not built: Refused with the scheduler's words.
  EXPECT_TRUE(ApplyResizeAnswer(st, "mlp", grow, UnimplementedError("growing ... is not built yet"), 0, kT0, &events));
  EXPECT_EQ(Str(st, {"lastResize", "outcome"}), kResizeRefused);
  EXPECT_NE(Str(st, {"lastResize", "message"}).find("growing ... is not built yet"), std::string::npos);
  EXPECT_EQ(Reasons(events), (std::vector<std::string>{"ResizeRefused"}));

  // One under way already (an operator restarted mid-resize): followed.
  const ResizeAsk shrink{2, 1, "spec.workers.replicas is 1"};
  EXPECT_TRUE(ApplyResizeAnswer(st, "mlp", shrink, FailedPreconditionError("a resize ... is under way"), 4, kT0,
                                &events));
  EXPECT_EQ(Str(st, {"lastResize", "outcome"}), kResizePending);
  EXPECT_EQ(Int(st, {"lastResize", "epoch"}), 4);

  // The scheduler has that size already: the world says so, no resize.
  Json same = *ParseJson(R"({"world":{"workers":2,"epoch":0}})");
  EXPECT_TRUE(ApplyResizeAnswer(same, "mlp", shrink, Answer(3, 1, 3), 0, kT0, &events));
  EXPECT_EQ(Int(same, {"world", "workers"}), 1);
  EXPECT_FALSE(At(same, {"lastResize"}));
}

// Resized while suspended: the next run starts at the new size (pods, world); a size outside
// spec.elastic stays refused and the job resumes at its world.
TEST(ElasticResizeTest, AJobResizedWhileSuspendedResumesAtTheNewSize) {
  for (const int asked : {1, 5}) {
    Json job = ApiJob(ElasticSpec(2));
    std::vector<ObservedPod> pods = AllPods("Running");
    pods.pop_back();
    Round(job, pods, kT0);
    job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
    Round(job, pods, kT0 + std::chrono::seconds(1));
    ASSERT_EQ(Str(job, {"status", "phase"}), kSuspended);
    SetReplicas(job, asked);
    Round(job, {}, kT0 + std::chrono::seconds(2));  // the pods are gone
    job["spec"]["runPolicy"]["suspend"] = Json::boolean(false);
    const JobPlan plan = Round(job, {}, kT0 + std::chrono::seconds(3));
    int workers = 0;
    for (const DesiredPod& d : plan.create) workers += d.role == PodRole::kWorker;
    EXPECT_EQ(workers, asked == 1 ? 1 : 2) << asked;
    EXPECT_EQ(Int(job, {"status", "world", "workers"}), asked == 1 ? 1 : 2) << asked;
  }
}

// One resize at a time: a new `kubectl scale` while one is under way is asked once it is done.
TEST(ElasticResizeTest, AScaleWhileAResizeIsUnderWayIsAskedOnceItIsDone) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  ASSERT_NO_FATAL_FAILURE(ScaledTo2AndPending(job, pods));
  JobPlan plan;
  std::vector<JobPlan::Event> events;
  SetReplicas(job, 1);
  plan = Round(job, pods, kT0);
  EXPECT_FALSE(plan.resize) << "the one under way first";
  EXPECT_TRUE(plan.follow_resize);
  v1::JobProgress p;
  *p.mutable_world() = World(1, 30, 2);
  ASSERT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->from, 2);
  EXPECT_EQ(plan.resize->to, 1);
}

TEST(ElasticResizeTest, AJobThatEndsOrIsSuspendedWithAResizePendingLeavesNoResizingTrue) {
  for (const bool suspend : {false, true}) {
    Json job = ApiJob(ElasticSpec(3));
    std::vector<ObservedPod> pods = AllPods("Running");
    ASSERT_NO_FATAL_FAILURE(ScaledTo2AndPending(job, pods));
    if (suspend) {
      job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
    } else {
      for (auto& p : pods) {
        if (p.role == PodRole::kWorker) p.phase = "Succeeded";
      }
    }
    Round(job, pods, kT0 + std::chrono::seconds(1));
    EXPECT_EQ(Str(job, {"status", "phase"}), suspend ? kSuspended : kSucceeded);
    EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeAbandoned);
    EXPECT_EQ(Condition(job["status"], kResizingCondition), "False");
    EXPECT_NE(Str(job, {"status", "lastResize", "message"}).find(suspend ? "suspended" : "ended"),
              std::string::npos);
  }
}

TEST(ElasticResizeTest, AResizeTheSchedulerGaveUpIsAbandonedAndNotAskedAgainUntilTheReplicasChange) {
  Json job = ApiJob(ElasticSpec(3));
  std::vector<ObservedPod> pods = AllPods("Running");
  ASSERT_NO_FATAL_FAILURE(ScaledTo2AndPending(job, pods));
  JobPlan plan;
  std::vector<JobPlan::Event> events;

  v1::JobProgress p;  // nothing under way, still epoch 0: given up
  *p.mutable_world() = World(0, 0, 3);
  EXPECT_FALSE(ApplyResizeProgress(job["status"], "mlp", p, kT0, &events));
  EXPECT_EQ(Str(job, {"status", "lastResize", "outcome"}), kResizeAbandoned);
  EXPECT_EQ(Condition(job["status"], kResizingCondition, "reason"), "ResizeAbandoned");
  EXPECT_EQ(Int(job, {"status", "world", "workers"}), 3);

  plan = Round(job, pods, kT0 + std::chrono::seconds(1));
  EXPECT_FALSE(plan.resize);
  EXPECT_FALSE(plan.follow_resize);
  SetReplicas(job, 1);
  plan = Round(job, pods, kT0 + std::chrono::seconds(2));
  ASSERT_TRUE(plan.resize);
  EXPECT_EQ(plan.resize->to, 1);
}

}  // namespace
}  // namespace trellis::op
