// Whole-job restarts (docs/kubernetes.md#whole-job-restart): every pod of the job deleted and,
// once the last old one is gone, the whole set created again; the new run resumes from the
// newest checkpoint (rank 0's Checkpointer, or the servers' shards in update mode). Two causes:
//   - a failure in-job recovery cannot heal: the job's scheduler failed the job (every worker
//     lost at once, a server lost without retained pushes, a worker out of restarts). Under
//     runPolicy.failurePolicy RestartJob the job restarts, counted toward backoffLimit; under
//     FailJob it fails (plan_phases.cc, FailTold).
//   - every worker pod is being stopped from outside (deleted, evicted, a drained node pool):
//     the job's scheduler stops the job as a whole (exit checkpoint) and takes no replacement
//     into it, so the scheduler and server pods go too; not counted, as a lone pod's eviction.
// The old pods must all be gone first: a new pod could otherwise register with the old
// scheduler, which is ending with the old run. status.lastRestart.oldPodsGoing holds that
// across rounds.
#pragma once

#include <string>

#include "operator/plan_phases.h"

namespace trellis::op {

// A whole-job restart waits for the old pods (status.lastRestart.oldPodsGoing).
bool OldPodsGoing(const PlanRound& r);
// The job's scheduler said it stops the job as a whole (condition StoppedFromOutside True,
// written by the progress poller).
bool StoppedFromOutside(const PlanRound& r);

// status.lastRestart {reason, message, time, wholeJob}: the operator's latest restart, of a pod
// or of the whole job.
void NoteLastRestart(PlanRound& r, const std::string& reason, const std::string& message, bool whole_job);

// Deletes every pod of the job this round and marks the restart in the status
// (status.lastRestart; `counted`: status.jobRestarts grows, toward backoffLimit). The phase is
// Restarting with `reason` and `message`, and a Warning event.
void RestartWholeJob(PlanRound& r, const std::string& reason, const std::string& message, bool counted);

// Every worker pod of a running job is gone or being deleted, not by its program's failure, or
// its scheduler said it stops the job as a whole (StoppedFromOutside): restarts the whole job
// (not counted). Nothing when the phase is decided already, the job is not running, or a
// whole-job restart is under way.
void RestartStoppedJob(PlanRound& r);

// While a whole-job restart waits for the old pods: deletes what is left of them and creates
// nothing (true). Once none is left, clears the mark (false: PlanPods creates the new set).
bool HoldForOldPods(PlanRound& r, PodsState& state);

}  // namespace trellis::op
