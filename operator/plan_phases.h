// PlanJob's phases (operator/job_status.h), each a step of the run policy over one PlanRound:
// what the round was given (the job's last status and spec, the observed pods, the desired-pod
// list of DesiredPodList, the time, the gang) and what it has decided so far (the plan, the new
// phase with its reason and message). PlanJob runs them in this order:
//
//   the job ended earlier     -> EndJob
//   spec.runPolicy.suspend    -> Suspend
//   otherwise                 StartClock, FailLostPods, DecideFailures, NoteLostWorkers,
//                             DecideSuccess,
//                             RestartStoppedJob (operator/job_restart.h); then
//     the job ends now        -> EndJob
//     otherwise               WriteRunningCounts, PlanPods, HoldWithoutPodGroup, WhyPodsWait,
//                             DecidePhase, Conclude, WriteWaitConditions, PlanResize
//                             (operator/elastic_resize.h)
//
// A phase that ends the job sets `phase` (Finish); the later ones then decide nothing more.
// Features that change the policy (resizing a running job, preemption) are phases here. An
// elastic job's round works with its world's replicas (WorldSpec), not the ones asked for.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "operator/desired.h"
#include "operator/gang.h"
#include "operator/job_status.h"
#include "operator/plan_status.h"

namespace trellis::op {

bool Terminal(const std::string& phase);  // Succeeded or Failed

struct PlanRound {
  // The status of `job` is where the round starts from (its phase is old_phase).
  PlanRound(const Json& job, const JobSpec& spec, const std::vector<ObservedPod>& pods, Clock::time_point now,
            const GangObservation* gang);

  // What the round was given.
  const JobSpec& spec;
  const std::string name;  // the job's
  const std::vector<ObservedPod>& pods;
  std::map<std::string, const ObservedPod*> observed;  // `pods` by name
  const int64_t generation;                            // the job's metadata.generation
  const std::vector<int> members;                      // WorldMembers of the job's status
  const std::vector<int> worker_slots;                 // WorkerSlots(spec, job)
  const std::vector<DesiredPod> desired;               // DesiredPodList(name, spec, worker_slots)
  const Clock::time_point now;
  const GangObservation* const gang;  // what the reconciler found of the PodGroup; null: no gang
  const std::string old_phase;        // status.phase before this round

  // What it has decided.
  JobPlan plan;  // its status starts as the job's
  std::string phase, reason, message;  // the new phase (empty: not decided yet) and why
  RestartCounts restarts;              // from the status; a pod replaced this round adds one
  bool restarted = false;              // a failed pod is replaced this round

  // Ends the job: `phase` (Succeeded or Failed) with its reason and message, and
  // status.completionTime unless set.
  void Finish(const std::string& end, const std::string& why, const std::string& what);
};

// The job has ended (in an earlier round, or `phase` is Succeeded or Failed now): no pod is
// replaced; cleanPodPolicy's pods are deleted, the counts keep what finished, the progress says
// how it ended, and ttlSecondsAfterFinished deletes the job (or is waited for).
void EndJob(PlanRound& r);

// spec.runPolicy.suspend: every pod is deleted, the phase is Suspended and the deadline's clock
// stops (startTime is dropped: a resumed job starts it again).
void Suspend(PlanRound& r);

// A resumed job says so; startTime is set on the first round that runs the job, and
// activeDeadlineSeconds past it fails the job (before: look again then).
void StartClock(PlanRound& r);

// A server or worker pod of a running job under restartPolicy Never is gone or being deleted
// (kubectl delete, a drain's eviction): the job fails (PodDeleted), before the failures of the
// others that follow from it. Under the other policies PlanPods recreates it. An elastic job's
// worker is lost instead (its scheduler hears of it from its agent, the progress poller from the
// scheduler) and the job goes on, unless fewer than spec.elastic.minWorkers would be left.
void FailLostPods(PlanRound& r);

// Failed pods, the one that failed first first: each is replaced (deleted this round, recreated
// in a later one once gone) under its role's restart policy and backoffLimit, with a Warning
// event, or the job fails naming it and the first failure of the job (status.firstFailure).
// A disrupted pod (evicted, preempted) is replaced without counting toward backoffLimit; a new
// scheduler pod recovers the running job. No pod is replaced once a pod's agent reported the job
// failed at its scheduler: none could join it.
void DecideFailures(PlanRound& r);

// Every desired worker succeeded: the job succeeded (an elastic job's workers resized away do
// not count).
void DecideSuccess(PlanRound& r);

// The counts of a job that runs (a failed pod being replaced this round still counts as failed).
void WriteRunningCounts(PlanRound& r);

// Where the desired pods stand.
struct PodsState {
  bool all_up = true;  // every desired pod runs (or, a worker, succeeded) and none is going
  std::string going;   // the first desired pod being deleted from outside; empty: none
};
// Compares the desired list with the observed pods: creates what is missing (a pod still being
// deleted is recreated once it is gone, as its name is the same), deletes the pods beyond the
// replicas (the spec was scaled down; an elastic job's workers resized away once they ended),
// and says where the rest stand.
PodsState PlanPods(PlanRound& r);

// A gang-scheduled job whose PodGroup could not be made creates no pod: the gang scheduler
// would never place them.
void HoldWithoutPodGroup(PlanRound& r, PodsState& state);

// Why the pods wait, when the cluster says so.
struct PodWaits {
  Wait unschedulable;  // the PodGroup is missing, the gang or a pod cannot be placed
  Wait cannot_start;   // a placed pod's container cannot start (image, configuration)
};
PodWaits WhyPodsWait(const PlanRound& r, const PodsState& state);

// The phase of a job that runs: Restarting while failed or lost pods are replaced, Running once
// every pod is up, else Pending (or Restarting still, until every pod is back up).
void DecidePhase(PlanRound& r, const PodsState& state);

// Writes the phase with its condition and, when it changed, its Event (ConcludePhase).
void Conclude(PlanRound& r);

// The Unschedulable and CannotStart conditions of a job that runs.
void WriteWaitConditions(PlanRound& r, const PodWaits& waits);

}  // namespace trellis::op
