// The elastic job's documents and rounds shared by the operator's elastic tests
// (elastic_resize_test, elastic_loss_test).
#pragma once

#include <string>
#include <vector>

#include "operator/elastic_resize.h"
#include "operator/plan_phases.h"
#include "tests/unit/operator/test_jobs.h"

namespace trellis::op::testing {

// kSpec's shape (2 servers, 3 workers) with spec.elastic [1, 3] and restartPolicy Never.
inline std::string ElasticSpec(int replicas) {
  return R"({"servers":{"replicas":2},
             "workers":{"replicas":)" + std::to_string(replicas) + R"(,"command":["trellis-mlp"]},
             "elastic":{"minWorkers":1,"maxWorkers":3},
             "runPolicy":{"restartPolicy":"Never"}})";
}

// Parses the job as the reconciler does (a replicas outside spec.elastic falls back to the
// world's), plans one round and feeds the status back.
inline JobPlan Round(Json& job, const std::vector<ObservedPod>& pods, Clock::time_point now) {
  StatusOr<JobSpec> spec = ParseJobSpec(job.serialize());
  if (!spec.ok()) spec = ParseAtWorldReplicas(job, spec.status());
  JobPlan plan = PlanJob(job, spec, pods, now);
  job["status"] = plan.status;
  return plan;
}

inline void SetReplicas(Json& job, int n) { job["spec"]["workers"]["replicas"] = Json::number(n); }

inline v1::WorldInfo World(int64_t epoch, int64_t from_step, int workers) {
  v1::WorldInfo w;
  w.set_epoch(epoch);
  w.set_from_step(from_step);
  for (int i = 0; i < workers; ++i) w.add_members(i);
  return w;
}

// A world with these members (slots): one a loss left with a gap.
inline v1::WorldInfo World(int64_t epoch, int64_t from_step, const std::vector<int>& members) {
  v1::WorldInfo w = World(epoch, from_step, 0);
  for (int m : members) w.add_members(m);
  return w;
}

inline v1::ResizeResponse Answer(int64_t current_epoch, int current_workers, int64_t epoch) {
  v1::ResizeResponse r;
  *r.mutable_current() = World(current_epoch, 0, current_workers);
  r.set_epoch(epoch);
  return r;
}

inline std::vector<std::string> Reasons(const std::vector<JobPlan::Event>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.reason);
  return out;
}

}  // namespace trellis::op::testing
