// The run policy as a pure function: from a TrainingJob (its spec and last status), the pods
// observed for it and the time, decide the new status and what to create or delete. Level-based:
// the same inputs give the same plan, so running it twice, or after a crash, is safe. PlanJob
// runs the phases of operator/plan_phases.h over the job's desired-pod list (DesiredPodList).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "operator/desired.h"
#include "operator/gang.h"
#include "operator/json_util.h"
#include "operator/observed_pod.h"

namespace trellis::op {

// Phases (status.phase) and the reasons the conditions carry.
inline constexpr char kPending[] = "Pending";
inline constexpr char kRunning[] = "Running";
inline constexpr char kRestarting[] = "Restarting";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kSuspended[] = "Suspended";

// An elastic job's resize for the scheduler (operator/elastic_resize.h).
struct ResizeAsk {
  int from = 0, to = 0;  // workers, or servers when `servers`
  std::string reason;
  bool servers = false;  // a resize of the parameter servers (docs/elastic.md#servers)
};

struct JobPlan {
  Json status;                          // the whole new status object
  std::vector<DesiredPod> create;       // pods to create, in DesiredPodList's order
  std::vector<std::string> remove;      // pod names to delete
  bool ensure_support = false;          // token Secret, ConfigMap and scheduler Service must exist
  bool delete_job = false;              // ttlSecondsAfterFinished has passed
  std::optional<Clock::duration> requeue_after;  // look again then (deadline, TTL)
  // Set when the phase changes: a Kubernetes Event to record.
  std::string event_type;  // Normal or Warning; empty: no event
  std::string event_reason;
  std::string event_message;
  // Events of this round besides the phase's: one per pod restarted or recreated (two pods
  // restarted at once are two events). One equal to the phase's event is recorded once.
  struct Event {
    std::string type, reason, message;
  };
  std::vector<Event> events;
  // Elastic jobs: ask the job's scheduler for this resize; follow one under way (its progress).
  std::optional<ResizeAsk> resize;
  bool follow_resize = false;
};

// `spec` is ParseJobSpec of the job object (an error makes the job Failed with reason InvalidSpec
// and the parser's message). `job` supplies the previous status. `gang`: what the reconciler
// found of the job's PodGroup (gang-scheduled jobs only). Pods that cannot be scheduled, or a
// gang that cannot, set the condition Unschedulable (True, with the scheduler's message) while
// the job waits; it turns False once they are placed.
JobPlan PlanJob(const Json& job, const StatusOr<JobSpec>& spec, const std::vector<ObservedPod>& pods,
                Clock::time_point now, const GangObservation* gang = nullptr);

// Whether status.conditions holds the condition `type` with status "True".
bool ConditionTrue(const Json& status, const std::string& type);
// Sets (or updates) the condition of `type` in status.conditions; lastTransitionTime changes only
// when the condition's status does. Messages are cut to kMaxConditionMessage bytes: a job with
// thousands of errors still gets a status the API server accepts and `kubectl describe` can show.
inline constexpr size_t kMaxConditionMessage = 4096;
void SetCondition(Json& status, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, Clock::time_point now);

}  // namespace trellis::op
