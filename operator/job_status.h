// The run policy as a pure function: from a TrainingJob (its spec and last status), the pods
// observed for it and the time, decide the new status and what to create or delete. Level-based:
// the same inputs give the same plan, so running it twice, or after a crash, is safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "common/process/termination_report.h"
#include "operator/desired.h"
#include "operator/gang.h"
#include "operator/json_util.h"

namespace trellis::op {

// Phases (status.phase) and the reasons the conditions carry.
inline constexpr char kPending[] = "Pending";
inline constexpr char kRunning[] = "Running";
inline constexpr char kRestarting[] = "Restarting";
inline constexpr char kSucceeded[] = "Succeeded";
inline constexpr char kFailed[] = "Failed";
inline constexpr char kSuspended[] = "Suspended";

struct ObservedPod {
  std::string name;
  PodRole role = PodRole::kWorker;
  int index = 0;
  std::string phase;   // Pending, Running, Succeeded, Failed, Unknown
  int exit_code = -1;  // of the terminated "trellis" container; -1 when unknown
  bool deleting = false;
  // The scheduler's message while it cannot place the pod (condition PodScheduled=False with
  // reason Unschedulable); empty otherwise.
  std::string unschedulable;
  std::string finished_at;  // that container's state.terminated.finishedAt (RFC 3339); empty: unknown
  // Why the pod was disrupted from outside, not by its program: "Evicted" (the kubelet's
  // node-pressure eviction), or the reason of a DisruptionTarget condition (eviction API,
  // preemption, taint manager). Empty: none.
  std::string disruption;
  // Of the terminated "trellis" container: the kubelet's reason (OOMKilled, Error, StartError,
  // ...) and its message (the agent's termination report, common/process/termination_report.h, or the
  // container runtime's words); empty: unknown.
  std::string terminated_reason;
  std::string terminated_message;
  TerminationReport report;  // parsed from terminated_message
  std::string memory_limit;  // that container's resources.limits.memory; empty: none
  // The "trellis" container cannot start (state.waiting with ErrImagePull, ImagePullBackOff,
  // InvalidImageName, CreateContainerConfigError, ...): "ImagePullBackOff: <the kubelet's
  // message>". Empty: none.
  std::string cannot_start;
  std::string cannot_start_reason;  // the kubelet's reason alone
};
// How a failed pod ended, for people: "was OOMKilled (memory limit 256Mi; exit code 137)",
// "failed: command not found: /app/train (exit code 127)", "failed with exit code 3"; the
// program's own last error follows when the report has one ("failed with exit code 1:
// ValueError: boom", at most 512 bytes of it).
std::string HowItFailed(const ObservedPod& p);
// nullopt for a pod without valid trellis.io/role and trellis.io/rank labels (not ours to judge).
std::optional<ObservedPod> ObservePod(const Json& pod);

struct JobPlan {
  Json status;                          // the whole new status object
  std::vector<std::string> create;      // pod names to create
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
};

// `spec` is ParseJobSpec of the job object (an error makes the job Failed with reason InvalidSpec
// and the parser's message). `job` supplies the previous status. `gang`: what the reconciler
// found of the job's PodGroup (gang-scheduled jobs only). Pods that cannot be scheduled, or a
// gang that cannot, set the condition Unschedulable (True, with the scheduler's message) while
// the job waits; it turns False once they are placed.
JobPlan PlanJob(const Json& job, const StatusOr<JobSpec>& spec, const std::vector<ObservedPod>& pods,
                Clock::time_point now, const GangObservation* gang = nullptr);

// Sets (or updates) the condition of `type` in status.conditions; lastTransitionTime changes only
// when the condition's status does. Messages are cut to kMaxConditionMessage bytes: a job with
// thousands of errors still gets a status the API server accepts and `kubectl describe` can show.
inline constexpr size_t kMaxConditionMessage = 4096;
void SetCondition(Json& status, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, Clock::time_point now);

}  // namespace trellis::op
