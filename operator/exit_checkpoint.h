// A suspended job's exit checkpoint (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint):
// before its pods are deleted, the reconciler asks the job's scheduler to stop the job at a step
// boundary (SchedulerCalls::StopJob); rank 0 writes the checkpoint of the step it completed and the
// pods are deleted once the scheduler has heard of it, or once the job's
// terminationGracePeriodSeconds have passed, or at once when rank 0 writes none. A scheduler the
// operator cannot reach (an operator outside the cluster network, a scheduler pod restarting)
// is waited for kSchedulerUnreachableWait only: the pods' own agents ask the scheduler when they
// are stopped (PodStopping), and the whole job still stops with the exit checkpoint when they
// reach it. The condition Stopping says which: True while it waits, False with reason
// ExitCheckpointWritten, NoExitCheckpoint or SchedulerUnreachable. Pure: the reconciler calls
// the scheduler and deletes the pods.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "operator/job_status.h"
#include "operator/json_util.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::op {

inline constexpr char kStoppingCondition[] = "Stopping";
inline constexpr std::chrono::seconds kSchedulerUnreachableWait{3};

// Whether this suspension's exit checkpoint is settled already: the Stopping condition turned
// False no earlier than the Suspended condition turned True.
bool ExitCheckpointSettled(const Json& status);
// The Stopping condition is True: the exit checkpoint was asked for and is not settled yet.
bool ExitCheckpointUnderWay(const Json& status);

struct ExitCheckpointStep {
  bool hold_pods = false;  // keep the pods: rank 0 is writing the checkpoint
  // Set when the wait ends: an Event (reason ExitCheckpointWritten or NoExitCheckpoint).
  std::optional<JobPlan::Event> event;
};

// One look at a suspended job with checkpoints whose pods still run. `progress`: the scheduler's
// answer to StopJob (an error: unreachable, e.g. the scheduler pod is gone). `workers_running`:
// some worker pod is Running (none: nobody is left to write one). Updates the Stopping
// condition and status.checkpoint in `status`.
ExitCheckpointStep StepExitCheckpoint(Json& status, const StatusOr<v1::JobProgress>& progress,
                                      bool workers_running, std::chrono::seconds grace, Clock::time_point now);

}  // namespace trellis::op
