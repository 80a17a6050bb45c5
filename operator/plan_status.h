// How a plan (operator/job_status.h) writes the job's status: the per-role counts and restarts,
// the phase with its condition and Event, and the waiting conditions. Helpers of PlanJob's phases
// (operator/plan_phases.h); pure functions of what they are given.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "operator/job_status.h"

namespace trellis::op {

// A role's pods by phase. Pods being deleted (deletionTimestamp, or deleted by this very plan)
// are neither active nor running: after the end, and while suspended, the status shows what is
// left.
struct RoleCounts {
  int active = 0;  // Pending or Running
  int running = 0;
  int succeeded = 0;
  int failed = 0;
};
// `removing`: the pods this plan deletes.
std::map<PodRole, RoleCounts> CountPods(const std::vector<ObservedPod>& pods, const std::set<std::string>& removing);

// A role's restarts, as status.replicaStatuses keeps them: its pods' replacements (what
// backoffLimit counts) and its programs' restarts inside their pods (the progress poller's count
// from the scheduler, kept as programRestarts; the agent limits those per pod).
struct RestartCounts {
  std::map<PodRole, int> pods = {{PodRole::kScheduler, 0}, {PodRole::kServer, 0}, {PodRole::kWorker, 0}};
  std::map<PodRole, int> program = {{PodRole::kScheduler, 0}, {PodRole::kServer, 0}, {PodRole::kWorker, 0}};
  int job = 0;           // whole-job restarts (status.jobRestarts; runPolicy.failurePolicy RestartJob)
  int PodTotal() const;  // every role's replacements
  int BackoffTotal() const { return PodTotal() + job; }  // what backoffLimit is compared with
};
// The restarts an earlier round wrote into `status` (its restarts less programRestarts are the
// pods'). Clamped: anyone allowed to write the status can, and sums must not overflow.
RestartCounts ReadRestarts(const Json& status);

// Writes replicaStatuses, restarts and the WORKERS/SERVERS columns. `keep_finished`: the job has
// ended, its pods are being cleaned up; succeeded/failed counts never go down then.
void WriteCounts(Json& status, const std::map<PodRole, RoleCounts>& counts, const RestartCounts& restarts,
                 const JobSpec& spec, bool keep_finished);

// The pods cleanPodPolicy deletes once the job has ended.
std::vector<std::string> CleanUp(CleanPodPolicy policy, const std::vector<ObservedPod>& pods);

// Writes status.phase and, when it differs from `old_phase`, sets the phase's condition True with
// `reason` and `message`, turns the transient condition it leaves (Running, Restarting,
// Suspended) False, and makes the phase's Event (Warning for Failed and Restarting).
void ConcludePhase(JobPlan& plan, const std::string& old_phase, const std::string& phase, const std::string& reason,
                   const std::string& message, Clock::time_point now);

// The waiting conditions: something keeps the job's pods from being placed (Unschedulable) or
// their containers from starting (CannotStart: an image that cannot be pulled, a configuration
// refused).
inline constexpr char kUnschedulable[] = "Unschedulable";
inline constexpr char kCannotStart[] = "CannotStart";
// Why the pods wait; an empty reason: they do not.
struct Wait {
  std::string reason;
  std::string message;
};
// The condition `type` is True with `wait` while the pods wait. Jobs that never waited never get
// it; once True, it turns False with `cleared` when the wait ends. Turning True is a Warning event
// (the phase's, unless the plan already has a Warning there).
void UpdateWaitCondition(JobPlan& plan, const char* type, const Wait& wait, const Wait& cleared,
                         Clock::time_point now);

}  // namespace trellis::op
