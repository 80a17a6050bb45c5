// How failures reach the job (issue 32): the container's terminated state (OOMKilled and the
// memory limit, the agent's termination report) names the real cause; a job the scheduler has
// failed gets no pod recreated; a missing command is not retried; each restart is an Event; a
// container that cannot start is named; restarts inside the pods count as restarts but not
// toward backoffLimit; a finished job keeps no running figures; the program's own last error
// (the report's program-error) follows the exit code.
#include <gtest/gtest.h>

#include "operator/job_status.h"
#include "operator/progress_status.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::ApiJob;
using testing::kT0;
using testing::Step;

// 1 server, 2 workers, OnFailure, backoffLimit 2, a 256Mi memory limit on the workers.
constexpr char kJob[] =
    R"({"servers":{"replicas":1},
        "workers":{"replicas":2,"command":["trellis-mlp"],"resources":{"limits":{"memory":"256Mi"}}},
        "runPolicy":{"restartPolicy":"OnFailure","backoffLimit":2}})";

// A pod as the API server returns it; `container` is the "trellis" container's status.
Json ApiPod(const std::string& role, int rank, const std::string& phase, const std::string& container) {
  const std::string name = role == "scheduler" ? "mlp-scheduler" : "mlp-" + role + "-" + std::to_string(rank);
  std::string text = R"({"metadata":{"name":")" + name + R"(","labels":{"trellis.io/role":")" + role +
                     R"(","trellis.io/rank":")" + std::to_string(rank) + R"("}},
      "spec":{"containers":[{"name":"sidecar"},{"name":"trellis","resources":{"limits":{"memory":"256Mi"}}}]},
      "status":{"phase":")" + phase + R"(","containerStatuses":[)" + container + "]}}";
  auto j = ParseJson(text);
  EXPECT_TRUE(j.has_value()) << text;
  return *j;
}

std::string Terminated(int code, const std::string& reason, const std::string& message,
                       const std::string& finished = "2027-01-15T08:00:00Z") {
  Json t = Json::object();
  t["exitCode"] = Json::number(code);
  t["reason"] = JStr(reason);
  if (!message.empty()) t["message"] = JStr(message);
  t["finishedAt"] = JStr(finished);
  Json c = Json::object();
  c["name"] = JStr("trellis");
  Put(c, {"state", "terminated"}, t);
  return c.serialize();
}

std::vector<ObservedPod> Running() {
  std::vector<ObservedPod> pods;
  for (const Json& p : {ApiPod("scheduler", 0, "Running", ""), ApiPod("server", 0, "Running", ""),
                        ApiPod("worker", 0, "Running", ""), ApiPod("worker", 1, "Running", "")}) {
    pods.push_back(*ObservePod(p));
  }
  return pods;
}

// `pods` with the one named `name` replaced by `pod`.
std::vector<ObservedPod> With(std::vector<ObservedPod> pods, const Json& pod) {
  ObservedPod o = *ObservePod(pod);
  for (auto& p : pods) {
    if (p.name == o.name) p = o;
  }
  return pods;
}

const Json* Condition(const Json& status, const std::string& type) {
  const Json* conds = At(status, {"conditions"});
  for (size_t i = 0; conds && i < conds->size(); ++i) {
    if (Str(conds->at(i), {"type"}) == type) return &conds->at(i);
  }
  return nullptr;
}

TEST(ObservePodTest, ReadsTheTerminatedStateTheReportAndTheMemoryLimit) {
  auto p = ObservePod(ApiPod("worker", 0, "Failed",
                             Terminated(137, "OOMKilled", "exit: program killed by SIGKILL (code 137)\nrestarts: 2\n")));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->exit_code, 137);
  EXPECT_EQ(p->terminated_reason, "OOMKilled");
  EXPECT_EQ(p->memory_limit, "256Mi");  // the "trellis" container's, not the sidecar's
  EXPECT_EQ(p->report.restarts, 2);
  EXPECT_EQ(HowItFailed(*p), "was OOMKilled (memory limit 256Mi; exit code 137) after 2 restarts inside the pod");
  auto waiting = ObservePod(ApiPod("worker", 1, "Pending",
      R"({"name":"trellis","state":{"waiting":{"reason":"ImagePullBackOff","message":"Back-off pulling image \"x:1\""}}})"));
  EXPECT_EQ(waiting->cannot_start, "ImagePullBackOff: Back-off pulling image \"x:1\"");
  auto creating = ObservePod(ApiPod("worker", 1, "Pending",
                                    R"({"name":"trellis","state":{"waiting":{"reason":"ContainerCreating"}}})"));
  EXPECT_EQ(creating->cannot_start, "");  // on its way, not stuck
}

TEST(HowItFailedTest, NamesTheCause) {
  ObservedPod p;
  p.exit_code = 127;
  EXPECT_EQ(HowItFailed(p), "failed with exit code 127 (command not found)");
  p.report.command_not_found = "/app/train";
  EXPECT_EQ(HowItFailed(p), "failed: command not found: /app/train (exit code 127)");
  ObservedPod q;
  q.exit_code = 128;
  q.terminated_reason = "StartError";
  q.terminated_message = "exec: \"/x\": stat /x: no such file or directory";
  EXPECT_EQ(HowItFailed(q), "failed with exit code 128 (StartError): exec: \"/x\": stat /x: no such file or directory");
  ObservedPod r;
  r.exit_code = 3;
  r.terminated_reason = "Error";
  EXPECT_EQ(HowItFailed(r), "failed with exit code 3");
  r.terminated_reason = "OOMKilled";
  r.exit_code = 137;
  EXPECT_EQ(HowItFailed(r), "was OOMKilled (no memory limit; exit code 137)");
}

TEST(HowItFailedTest, TheProgramsOwnErrorFollows) {
  ObservedPod p;
  p.exit_code = 78;
  p.terminated_reason = "Error";
  p.report.exit = "program exited with code 78";
  p.report.program_error = "ConfigurationError: trellis.torch: this worker rejoined the running job after step 738";
  EXPECT_EQ(HowItFailed(p),
            "failed with exit code 78: ConfigurationError: trellis.torch: this worker rejoined the running job "
            "after step 738");
  p.report.restarts = 2;
  EXPECT_EQ(HowItFailed(p).rfind("failed with exit code 78 after 2 restarts inside the pod: ConfigurationError: ", 0),
            0u) << HowItFailed(p);
  // Cut like the other fields.
  p.report.restarts = 0;
  p.report.program_error = "ValueError: " + std::string(2000, 'x');
  const std::string cut = HowItFailed(p);
  EXPECT_EQ(cut.size(), std::string("failed with exit code 78: ").size() + 512) << cut;
  EXPECT_EQ(cut.substr(cut.size() - 3), "...");
  ObservedPod oom;
  oom.exit_code = 137;
  oom.terminated_reason = "OOMKilled";
  oom.report.program_error = "MemoryError";
  EXPECT_EQ(HowItFailed(oom), "was OOMKilled (no memory limit; exit code 137): MemoryError");
}

TEST(PodFailureTest, AFailedWorkersOwnErrorIsInTheStatusAndTheEvent) {
  Json job = ApiJob(kJob);
  Step(job, Running(), kT0);
  JobPlan plan = Step(job, With(Running(), ApiPod("worker", 1, "Failed", Terminated(78, "Error",
      "exit: program exited with code 78\n"
      "program-error: trellis.ConfigurationError: trellis.torch: this worker rejoined the running job\n"))),
      kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  const Json* failed = Condition(plan.status, "Failed");
  ASSERT_NE(failed, nullptr);
  const std::string want =
      "job mlp: worker 1 (pod mlp-worker-1) failed with exit code 78: trellis.ConfigurationError: trellis.torch: "
      "this worker rejoined the running job (restartPolicy OnFailure)";
  EXPECT_EQ(Str(*failed, {"message"}), want);
  EXPECT_EQ(plan.event_message, want);
  EXPECT_NE(Str(plan.status, {"firstFailure"}).find("failed with exit code 78: trellis.ConfigurationError"),
            std::string::npos);
}

TEST(PodFailureTest, AJobFailedAtTheSchedulerGetsNoPodRecreatedAndNamesTheOomKill) {
  Json job = ApiJob(kJob);
  Step(job, Running(), kT0);
  const auto pods = With(Running(), ApiPod("worker", 0, "Failed", Terminated(137, "OOMKilled",
      "exit: program killed by SIGKILL (code 137)\nrestarts: 2\n"
      "job-failed: worker 0 (pod mlp-worker-0) failed: killed by SIGKILL (code 137)\n")));
  JobPlan plan = Step(job, pods, kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_TRUE(plan.create.empty());
  for (const auto& r : plan.remove) EXPECT_NE(r, "mlp-worker-0");  // kept to look at, not replaced
  EXPECT_EQ(Int(plan.status, {"restarts"}), 0);
  const Json* failed = Condition(plan.status, "Failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(Str(*failed, {"reason"}), "OOMKilled");
  const std::string msg = Str(*failed, {"message"});
  EXPECT_NE(msg.find("worker 0 (pod mlp-worker-0) was OOMKilled (memory limit 256Mi; exit code 137)"),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("the job's scheduler failed the job (worker 0 (pod mlp-worker-0) failed: killed by SIGKILL"),
            std::string::npos) << msg;
  EXPECT_EQ(plan.event_reason, "OOMKilled");
  EXPECT_EQ(plan.event_message, msg);
  EXPECT_NE(Str(plan.status, {"firstFailure"}).find("was OOMKilled (memory limit 256Mi"), std::string::npos);
}

TEST(PodFailureTest, APermanentFailureOfAFailedJobKeepsItsOwnMessage) {
  Json job = ApiJob(R"({"servers":{"replicas":1},"workers":{"replicas":2,"command":["w"]},
                        "runPolicy":{"restartPolicy":"Never"}})");
  Step(job, Running(), kT0);
  JobPlan plan = Step(job, With(Running(), ApiPod("worker", 0, "Failed", Terminated(3, "Error",
      "exit: program exited with code 3\njob-failed: worker 0 (pod mlp-worker-0) failed: exited with code 3\n"))),
      kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  EXPECT_EQ(plan.event_message, "job mlp: worker 0 (pod mlp-worker-0) failed with exit code 3 (restartPolicy Never)");
}

TEST(PodFailureTest, AnOomKillTheSchedulerSurvivesIsRestartedSayingSo) {
  Json job = ApiJob(kJob);
  Step(job, Running(), kT0);
  JobPlan plan = Step(job, With(Running(), ApiPod("worker", 1, "Failed", Terminated(137, "OOMKilled", ""))),
                      kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Restarting");
  EXPECT_EQ(plan.remove, std::vector<std::string>{"mlp-worker-1"});
  EXPECT_EQ(plan.event_reason, "PodRestarted");
  EXPECT_EQ(plan.event_message,
            "job mlp: worker 1 (pod mlp-worker-1) was OOMKilled (memory limit 256Mi; exit code 137); recreating it "
            "(restart 1 of at most 2)");
}

TEST(PodFailureTest, EveryRestartHasItsOwnEvent) {
  Json job = ApiJob(kJob);
  Step(job, Running(), kT0);
  auto pods = With(Running(), ApiPod("worker", 0, "Failed", Terminated(1, "Error", "", "2027-01-15T08:00:01Z")));
  pods = With(pods, ApiPod("worker", 1, "Failed", Terminated(1, "Error", "", "2027-01-15T08:00:02Z")));
  JobPlan plan = Step(job, pods, kT0 + std::chrono::seconds(5));
  ASSERT_EQ(plan.events.size(), 2u);
  EXPECT_EQ(plan.events[0].reason, "PodRestarted");
  EXPECT_EQ(plan.events[0].message,
            "job mlp: worker 0 (pod mlp-worker-0) failed with exit code 1; recreating it (restart 1 of at most 2)");
  EXPECT_EQ(plan.events[1].message,
            "job mlp: worker 1 (pod mlp-worker-1) failed with exit code 1; recreating it (restart 2 of at most 2)");
  // A later failure past backoffLimit ends the job; its message names the first failure too.
  JobPlan again = Step(job, With(Running(), ApiPod("server", 0, "Failed", Terminated(2, "Error", ""))),
                       kT0 + std::chrono::seconds(9));
  EXPECT_EQ(Str(again.status, {"phase"}), "Failed");  // backoffLimit 2 reached
  const std::string msg = Str(*Condition(again.status, "Failed"), {"message"});
  EXPECT_NE(msg.find("; the first failure: worker 0 (pod mlp-worker-0) failed with exit code 1"), std::string::npos)
      << msg;
}

TEST(PodFailureTest, ACommandThatDoesNotExistIsNamedAndNotRetried) {
  Json job = ApiJob(kJob);
  Step(job, Running(), kT0);
  JobPlan plan = Step(job, With(Running(), ApiPod("worker", 0, "Failed", Terminated(127, "Error",
      "error: program /app/train: not an executable file\ncommand-not-found: /app/train\n"
      "exit: program exited with code 127\nrestarts: 2\n"))), kT0 + std::chrono::seconds(5));
  EXPECT_EQ(Str(plan.status, {"phase"}), "Failed");
  const Json* failed = Condition(plan.status, "Failed");
  EXPECT_EQ(Str(*failed, {"reason"}), "CommandNotFound");
  EXPECT_NE(Str(*failed, {"message"}).find("worker 0 (pod mlp-worker-0) failed: command not found: /app/train"),
            std::string::npos) << Str(*failed, {"message"});
  EXPECT_EQ(Int(plan.status, {"restarts"}), 0);
}

TEST(PodFailureTest, AContainerThatCannotStartIsNamedUntilItStarts) {
  Json job = ApiJob(kJob);
  auto pods = Running();
  for (auto& p : pods) p.phase = "Pending";
  Step(job, pods, kT0);
  pods = With(pods, ApiPod("worker", 1, "Pending",
      R"({"name":"trellis","state":{"waiting":{"reason":"ImagePullBackOff","message":"Back-off pulling image \"x:1\""}}})"));
  JobPlan plan = Step(job, pods, kT0 + std::chrono::seconds(5));
  const Json* c = Condition(plan.status, "CannotStart");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Str(*c, {"status"}), "True");
  EXPECT_EQ(Str(*c, {"reason"}), "ImagePullBackOff");
  EXPECT_EQ(Str(*c, {"message"}), "job mlp: pod mlp-worker-1 cannot start: ImagePullBackOff: Back-off pulling image \"x:1\"");
  EXPECT_EQ(plan.event_type, "Warning");
  EXPECT_EQ(plan.event_reason, "ImagePullBackOff");
  EXPECT_TRUE(Step(job, pods, kT0 + std::chrono::seconds(6)).event_type.empty());  // once
  JobPlan up = Step(job, Running(), kT0 + std::chrono::seconds(30));
  EXPECT_EQ(Str(*Condition(up.status, "CannotStart"), {"status"}), "False");
}

TEST(PodFailureTest, RestartsInsideThePodsCountButNotTowardBackoffLimit) {
  // Two restarts inside pods (written by the progress poller) and none of pods.
  Json job = ApiJob(kJob, R"({"phase":"Running","startTime":"2027-01-15T08:00:00Z",
      "replicaStatuses":{"worker":{"restarts":2,"programRestarts":2}},"restarts":2})");
  JobPlan plan = Step(job, Running(), kT0);
  EXPECT_EQ(Int(plan.status, {"restarts"}), 2);
  EXPECT_EQ(Int(plan.status, {"replicaStatuses", "worker", "restarts"}), 2);
  EXPECT_EQ(Int(plan.status, {"replicaStatuses", "worker", "programRestarts"}), 2);
  // A pod failure is still restart 1 of at most 2.
  JobPlan r = Step(job, With(Running(), ApiPod("worker", 0, "Failed", Terminated(1, "Error", ""))),
                   kT0 + std::chrono::seconds(1));
  EXPECT_EQ(Str(r.status, {"phase"}), "Restarting");
  EXPECT_NE(r.event_message.find("(restart 1 of at most 2)"), std::string::npos) << r.event_message;
  EXPECT_EQ(Int(r.status, {"replicaStatuses", "worker", "restarts"}), 3);
  EXPECT_EQ(Int(r.status, {"restarts"}), 3);
}

TEST(PodFailureTest, AFinishedJobKeepsNoRunningFigures) {
  Json job = ApiJob(kJob, R"({"phase":"Running","startTime":"2027-01-15T08:00:00Z",
      "progress":{"step":990,"totalSteps":1000,"samplesPerSecond":1230,"eta":"8s","etaSeconds":8,"stepSeconds":0.1},
      "conditions":[{"type":"Straggler","status":"True","reason":"SlowWorker","message":"m"}]})");
  auto pods = Running();
  for (auto& p : pods) {
    if (p.role == PodRole::kWorker) p.phase = "Succeeded";
  }
  JobPlan plan = Step(job, pods, kT0);
  ASSERT_EQ(Str(plan.status, {"phase"}), "Succeeded");
  const Json* p = At(plan.status, {"progress"});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Int(*p, {"step"}), 1000);
  EXPECT_EQ(At(*p, {"eta"}), nullptr);
  EXPECT_EQ(At(*p, {"etaSeconds"}), nullptr);
  EXPECT_EQ(At(*p, {"samplesPerSecond"}), nullptr);
  EXPECT_EQ(Str(*Condition(plan.status, "Straggler"), {"status"}), "False");
  // A failed job keeps the step it reached.
  Json failed = ApiJob(kJob, R"({"phase":"Failed","progress":{"step":500,"totalSteps":1000,"eta":"1m"}})");
  JobPlan f = Step(failed, {}, kT0);
  EXPECT_EQ(Int(f.status, {"progress", "step"}), 500);
  EXPECT_EQ(At(f.status, {"progress", "eta"}), nullptr);
}

TEST(ProgramRestartsTest, CountedFromTheSchedulersViewWithAnEventEach) {
  Json status = *ParseJson(R"({"replicaStatuses":{"worker":{"restarts":1}},"restarts":1})");
  v1::ClusterView view;
  for (int r = 0; r < 2; ++r) {
    auto* n = view.add_workers();
    n->set_rank(r);
    n->set_pod_name("mlp-worker-" + std::to_string(r));
    n->set_last_exit_code(1);
  }
  view.mutable_workers(1)->set_program_restarts(2);
  ProgramRestartsSeen seen;
  auto events = ApplyProgramRestarts(status, view, seen);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0],
            "worker 1 (pod mlp-worker-1): its program was restarted inside the pod by its agent (restart 1 there; "
            "the program's last exit code 1)");
  EXPECT_EQ(Int(status, {"replicaStatuses", "worker", "programRestarts"}), 2);
  EXPECT_EQ(Int(status, {"replicaStatuses", "worker", "restarts"}), 3);
  EXPECT_EQ(Int(status, {"restarts"}), 3);
  // Nothing new: nothing written, no event.
  EXPECT_TRUE(ApplyProgramRestarts(status, view, seen).empty());
  EXPECT_EQ(Int(status, {"restarts"}), 3);
  view.mutable_workers(0)->set_program_restarts(1);
  EXPECT_EQ(ApplyProgramRestarts(status, view, seen).size(), 1u);
  EXPECT_EQ(Int(status, {"replicaStatuses", "worker", "programRestarts"}), 3);
  EXPECT_EQ(Int(status, {"restarts"}), 4);
  // A restarted operator (nothing seen) with restarts recorded: no event for old ones.
  ProgramRestartsSeen fresh;
  EXPECT_TRUE(ApplyProgramRestarts(status, view, fresh).empty());
  EXPECT_EQ(Int(status, {"restarts"}), 4);
}

}  // namespace
}  // namespace trellis::op
