// Job documents shared by the operator's unit tests.
#pragma once

#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "operator/desired.h"
#include "operator/job_status.h"
#include "operator/observed_pod.h"
#include "operator/json_util.h"

namespace trellis::op::testing {

// A TrainingJob as the API server returns it (metadata.uid, resourceVersion, status).
inline Json ApiJob(const std::string& spec_json, const std::string& status_json = "{}") {
  std::string text = R"({"apiVersion":"trellis.io/v1alpha1","kind":"TrainingJob",
    "metadata":{"name":"mlp","namespace":"team","uid":"u-1","resourceVersion":"7","labels":{"app":"demo"}},
    "spec":)" + spec_json + R"(,"status":)" + status_json + "}";
  return *ParseJson(text);
}

inline constexpr char kSpec[] =
    R"({"image":"reg/trellis:1","servers":{"replicas":2},
        "workers":{"replicas":3,"command":["trellis-mlp"],"args":["--steps","10"],"gpusPerWorker":1,
                   "env":[{"name":"A","value":"b"}],
                   "resources":{"requests":{"cpu":"2","memory":"4Gi"}}},
        "runPolicy":{"backoffLimit":2}})";

inline JobSpec Spec(const Json& job) { return *ParseJobSpec(job.serialize()); }

// The time the plans' tests start at.
inline const Clock::time_point kT0 = Clock::from_time_t(1'800'000'000);

// A pod of the job "mlp" as ObservePod would see it.
inline ObservedPod Pod(PodRole role, int index, const std::string& phase, int exit_code = -1) {
  ObservedPod p;
  p.role = role;
  p.index = index;
  p.name = PodName("mlp", role, index);
  p.phase = phase;
  p.exit_code = exit_code;
  return p;
}

// kSpec's pods: the scheduler and 2 servers Running, 3 workers in `worker_phase`.
inline std::vector<ObservedPod> AllPods(const std::string& worker_phase) {
  std::vector<ObservedPod> pods = {Pod(PodRole::kScheduler, 0, "Running"), Pod(PodRole::kServer, 0, "Running"),
                                   Pod(PodRole::kServer, 1, "Running")};
  for (int i = 0; i < 3; ++i) pods.push_back(Pod(PodRole::kWorker, i, worker_phase));
  return pods;
}

// Runs one plan and feeds its status back into the job, as the reconciler does.
inline JobPlan Step(Json& job, const std::vector<ObservedPod>& pods, Clock::time_point now,
                    const GangObservation* gang = nullptr) {
  JobPlan plan = PlanJob(job, ParseJobSpec(job.serialize()), pods, now, gang);
  job["status"] = plan.status;
  return plan;
}

// A field of the condition `type` in `status`; "<none>" without that condition.
inline std::string Condition(const Json& status, const std::string& type, const char* field = "status") {
  const Json* conds = At(status, {"conditions"});
  if (!conds) return "<none>";
  for (size_t i = 0; i < conds->size(); ++i) {
    if (Str(conds->at(i), {"type"}) == type) return Str(conds->at(i), {field});
  }
  return "<none>";
}

// The names of `pods` (a plan's create list), in order.
inline std::vector<std::string> Names(const std::vector<DesiredPod>& pods) {
  std::vector<std::string> out;
  for (const DesiredPod& p : pods) out.push_back(p.name);
  return out;
}

}  // namespace trellis::op::testing
