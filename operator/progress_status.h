// status.progress and the Straggler condition of a TrainingJob from the scheduler's JobProgress
// (docs/kubernetes.md#progress). Pure: the poller (progress_poller.h) decides when to write.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "operator/json_util.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::op {

inline constexpr char kStragglerCondition[] = "Straggler";
// A server or worker program found stalled and being restarted (docs/scheduler.md#stalls).
inline constexpr char kStalledCondition[] = "Stalled";
// The job's scheduler stops the running job as a whole because every worker's pod is being
// stopped from outside (operator/job_restart.h restarts the whole job on it).
inline constexpr char kStoppedFromOutsideCondition[] = "StoppedFromOutside";

// The status.progress object: step, totalSteps, samplesPerSecond, loss, eta, etaSeconds,
// stepSeconds, slowestRank, slowestPod, skew (figures rounded so noise alone changes nothing).
Json ProgressJson(const v1::JobProgress& p);

// The job has ended (Succeeded: `succeeded`): status.progress keeps what was reached, not the
// running figures -- no ETA, no samples per second; the step is the last one (totalSteps) when
// the job succeeded and knows it. A Straggler or Stalled condition still True turns False.
void FinishProgress(Json& status, bool succeeded, Clock::time_point now);

// The checkpoints rank 0 reported (docs/checkpoints.md#on-kubernetes): status.checkpoint
// {step, path, time, onExit} (the newest) and status.resumedFrom {step, path, time} (the one this
// run of the job started from). Kept as they are while the scheduler reports none (a replaced
// scheduler, a job between runs). Returns whether resumedFrom changed (worth an Event).
bool ApplyCheckpoint(Json& status, const v1::JobProgress& p);

// The message of the Resumed Event for `job`'s status.resumedFrom `resumed_from`.
std::string ResumedMessage(const std::string& job, const Json& resumed_from);

// A job that has just ended (Succeeded: `succeeded`), with its scheduler's last progress `p`:
// status.progress (when the workers reported any) and the checkpoints as the scheduler ends
// them, then FinishProgress. A short job, or a short resumed run, can end between two polls;
// its status still says where it resumed from and its last checkpoint. Returns whether
// resumedFrom changed (worth an Event).
bool ApplyLastProgress(Json& status, const v1::JobProgress& p, bool succeeded, Clock::time_point now);

// Writes status.progress, the checkpoints (ApplyCheckpoint) and the Straggler condition (True
// naming the rank and pod; False once none is, if the condition was ever set) into `status`.
// Returns whether anything changed.
bool ApplyProgress(Json& status, const v1::JobProgress& p, Clock::time_point now);

// A running job (not suspended: a suspend's stop is the reconciler's) whose scheduler says it is
// stopping the job as a whole: the StoppedFromOutside condition turns True with the scheduler's
// reason. The pods that replace the stopped ones may already exist, where the pods' objects went
// before their processes (what the operator alone cannot tell apart from a lone deletion).
// Returns whether it changed.
bool ApplyStoppedFromOutside(Json& status, const v1::JobProgress& p, bool suspended, Clock::time_point now);

// Restarts of the programs inside their pods (the agents' restarts: the pod lives on, so
// Kubernetes counts none) from the scheduler's view (NodeInfo.program_restarts) into
// replicaStatuses.<role>.programRestarts; the new ones are added to the role's restarts and to
// status.restarts. `known`: what this operator saw per (role, rank) before, updated. A rank not
// seen before counts from 0 while the status records none for its role, else from what the
// scheduler says now (an operator restarted meanwhile cannot tell which are new; the status
// count still catches up). Returns one Event message per new restart, naming the rank, its pod
// and its program's last exit code.
using ProgramRestartsSeen = std::map<std::pair<int, int32_t>, int32_t>;  // (role, rank) -> count
std::vector<std::string> ApplyProgramRestarts(Json& status, const v1::ClusterView& view,
                                              ProgramRestartsSeen& known);

}  // namespace trellis::op
