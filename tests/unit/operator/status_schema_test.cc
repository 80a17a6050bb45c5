// A real API server prunes status fields its structural schema does not declare: every field
// the operator writes must be in the CRD's status schema, with the declared type.
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "operator/elastic_resize.h"
#include "operator/job_status.h"
#include "operator/progress_status.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

void CheckAgainst(const Json& v, const YAML::Node& schema, const std::string& where) {
  ASSERT_TRUE(schema) << where << " is not in the CRD status schema (a real API server drops it)";
  const std::string type = schema["type"].as<std::string>("");
  if (v.is_object()) {
    ASSERT_EQ(type, "object") << where;
    for (const auto& [k, child] : v.as_object()) CheckAgainst(child, schema["properties"][k], where + "." + k);
  } else if (v.is_array()) {
    ASSERT_EQ(type, "array") << where;
    for (size_t i = 0; i < v.size(); ++i) CheckAgainst(v.at(i), schema["items"], where + "[]");
  } else if (v.is_string()) {
    EXPECT_EQ(type, "string") << where;
    if (schema["enum"]) {
      bool found = false;
      for (const auto& e : schema["enum"]) found |= e.as<std::string>() == v.as_string();
      EXPECT_TRUE(found) << where << " = " << v.as_string() << " is not in the enum";
    }
  } else if (v.is_integer()) {
    EXPECT_TRUE(type == "integer" || type == "number") << where;
  } else if (v.is_double()) {
    EXPECT_EQ(type, "number") << where;
  } else if (v.is_boolean()) {
    EXPECT_EQ(type, "boolean") << where;
  } else {
    ADD_FAILURE() << where << ": unexpected JSON type";
  }
}

TEST(StatusSchemaTest, EveryStatusFieldTheOperatorWritesIsDeclared) {
  YAML::Node status_schema = YAML::LoadFile(std::string(TRELLIS_SOURCE_DIR) +
                                            "/charts/trellis/crds/trainingjobs.trellis.io.yaml")["spec"]["versions"][0]
                                 ["schema"]["openAPIV3Schema"]["properties"]["status"];
  const auto t0 = testing::kT0;
  Json job = testing::ApiJob(testing::kSpec);
  const ObservedPod failed = testing::Pod(PodRole::kWorker, 0, "Failed", 1);
  const ObservedPod ok = testing::Pod(PodRole::kWorker, 1, "Succeeded", 0);
  // A run through every phase, so every condition type and count is written.
  std::vector<std::vector<ObservedPod>> worlds = {{}, {failed}, {ok}};
  for (const auto& pods : worlds) {
    JobPlan p = PlanJob(job, ParseJobSpec(job.serialize()), pods, t0);
    job["status"] = p.status;
    CheckAgainst(p.status, status_schema, "status");
  }
  job["spec"]["runPolicy"]["suspend"] = Json::boolean(true);
  CheckAgainst(PlanJob(job, ParseJobSpec(job.serialize()), {}, t0).status, status_schema, "status");
  // Progress from the scheduler: status.progress and a Straggler condition.
  v1::JobProgress progress;
  progress.set_reported(true);
  progress.set_step(120);
  progress.set_total_steps(1000);
  progress.set_samples_per_second(1234.5);
  progress.set_has_loss(true);
  progress.set_loss(0.25);
  progress.set_eta_seconds(88.2);
  progress.set_step_seconds(0.1);
  progress.set_slowest_rank(1);
  progress.set_slowest_pod("mlp-worker-1");
  progress.set_skew(7.5);
  progress.set_straggler_rank(1);
  progress.set_straggler_pod("mlp-worker-1");
  progress.add_ranks()->set_rank(0);
  progress.add_ranks()->set_rank(1);
  progress.mutable_checkpoint()->set_step(96);
  progress.mutable_checkpoint()->set_path("/ckpt/model-000000000096.ckpt");
  progress.mutable_checkpoint()->set_unix_ms(1'790'000'000'000);
  progress.mutable_checkpoint()->set_on_exit(true);
  progress.mutable_resumed_from()->set_step(64);
  progress.mutable_resumed_from()->set_path("/ckpt/model-000000000064.ckpt");
  Json running = job;
  ASSERT_TRUE(ApplyProgress(running["status"], progress, t0));
  ASSERT_TRUE(At(running, {"status", "progress", "samplesPerSecond"})->is_double());
  ASSERT_TRUE(At(running, {"status", "checkpoint", "onExit"}));
  ASSERT_TRUE(At(running, {"status", "resumedFrom", "step"}));
  CheckAgainst(running["status"], status_schema, "status");
  // Restarts of the programs inside their pods (the scheduler's view) and the first failure.
  v1::ClusterView view;
  view.add_workers()->set_program_restarts(2);
  ProgramRestartsSeen seen;
  ASSERT_EQ(ApplyProgramRestarts(running["status"], view, seen).size(), 2u);
  ASSERT_TRUE(At(running, {"status", "firstFailure"}));
  CheckAgainst(running["status"], status_schema, "status");
  // An elastic job's world and its resizes, in each outcome.
  Json elastic = testing::ApiJob(
      R"({"servers":{"replicas":1},"workers":{"replicas":2,"command":["trellis-mlp"]},)"
      R"("elastic":{"minWorkers":1,"maxWorkers":2}})");
  elastic["status"] = PlanJob(elastic, ParseJobSpec(elastic.serialize()), {}, t0).status;
  ASSERT_TRUE(At(elastic, {"status", "world", "workers"}));
  std::vector<JobPlan::Event> events;
  const ResizeAsk ask{2, 1, "spec.workers.replicas is 1"};
  v1::ResizeResponse answer;
  answer.set_epoch(1);
  ASSERT_TRUE(ApplyResizeAnswer(elastic["status"], "mlp", ask, answer, 0, t0, &events));
  CheckAgainst(elastic["status"], status_schema, "status");
  v1::JobProgress resized;
  resized.mutable_world()->set_epoch(1);
  resized.mutable_world()->set_from_step(40);
  resized.mutable_world()->add_members(0);
  ASSERT_FALSE(ApplyResizeProgress(elastic["status"], "mlp", resized, t0, &events));
  ASSERT_TRUE(At(elastic, {"status", "lastResize", "doneTime"}));
  CheckAgainst(elastic["status"], status_schema, "status");
  ASSERT_TRUE(ApplyResizeAnswer(elastic["status"], "mlp", ask, UnimplementedError("no"), 0, t0, &events));
  CheckAgainst(elastic["status"], status_schema, "status");
  answer.set_epoch(2);
  ASSERT_TRUE(ApplyResizeAnswer(elastic["status"], "mlp", ask, answer, 0, t0, &events));
  ASSERT_FALSE(ApplyResizeProgress(elastic["status"], "mlp", resized, t0, &events));
  ASSERT_EQ(Str(elastic, {"status", "lastResize", "outcome"}), kResizeAbandoned);
  CheckAgainst(elastic["status"], status_schema, "status");
  // A worker lost for good: status.world.lost and the loss's lastResize.
  Json lossy = testing::ApiJob(
      R"({"servers":{"replicas":1},"workers":{"replicas":2,"command":["trellis-mlp"]},)"
      R"("elastic":{"minWorkers":1,"maxWorkers":2},"runPolicy":{"restartPolicy":"Never"}})");
  std::vector<ObservedPod> pods = {testing::Pod(PodRole::kScheduler, 0, "Running"),
                                   testing::Pod(PodRole::kServer, 0, "Running"),
                                   testing::Pod(PodRole::kWorker, 0, "Running"),
                                   testing::Pod(PodRole::kWorker, 1, "Running")};
  lossy["status"] = PlanJob(lossy, ParseJobSpec(lossy.serialize()), pods, t0).status;
  pods[3].phase = "Failed";
  pods[3].report.lost = "worker 1 (pod mlp-worker-1) failed: exit code 1";
  lossy["status"] = PlanJob(lossy, ParseJobSpec(lossy.serialize()), pods, t0).status;
  ASSERT_TRUE(At(lossy, {"status", "world", "lost"}));
  ASSERT_TRUE(At(lossy, {"status", "lastResize", "lostWorker"}));
  ASSERT_TRUE(At(lossy, {"status", "lastResize", "generation"}));
  CheckAgainst(lossy["status"], status_schema, "status");
  Json bad = testing::ApiJob(R"({"workers":{}})");
  CheckAgainst(PlanJob(bad, ParseJobSpec(bad.serialize()), {}, t0).status, status_schema, "status");
}

}  // namespace
}  // namespace trellis::op
