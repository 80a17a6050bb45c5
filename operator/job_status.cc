#include "operator/job_status.h"

#include "operator/elastic_resize.h"
#include "operator/job_restart.h"
#include "operator/plan_phases.h"
#include "operator/plan_status.h"
#include "operator/server_takeover.h"

namespace trellis::op {
namespace {

// Never a crash, never a pod: the user fixes the spec (a new object) and applies again.
JobPlan PlanInvalidSpec(const Json& job, const Status& error, Clock::time_point now) {
  JobPlan plan;
  const Json* old_status = At(job, {"status"});
  plan.status = old_status && old_status->is_object() ? *old_status : Json::object();
  if (!At(plan.status, {"completionTime"})) plan.status["completionTime"] = JStr(FormatTime(now));
  ConcludePhase(plan, Str(plan.status, {"phase"}), kFailed, "InvalidSpec", error.message(), now);
  return plan;
}

}  // namespace

JobPlan PlanJob(const Json& job, const StatusOr<JobSpec>& spec, const std::vector<ObservedPod>& pods,
                Clock::time_point now, const GangObservation* gang) {
  if (!spec.ok()) return PlanInvalidSpec(job, spec.status(), now);
  const JobSpec world = WorldSpec(*spec, job);
  PlanRound r(job, world, pods, now, gang);
  if (Terminal(r.old_phase)) {  // ended in an earlier round
    r.phase = r.old_phase;
    EndJob(r);
    return std::move(r.plan);
  }
  if (spec->runPolicy.suspend) {
    Suspend(r);
    return std::move(r.plan);
  }
  StartClock(r);
  FailLostPods(r);
  DecideFailures(r);
  NoteLostWorkers(r);
  NoteTakenOverServers(r);
  DecideSuccess(r);
  RestartStoppedJob(r);
  if (Terminal(r.phase)) {  // ends now
    EndJob(r);
    return std::move(r.plan);
  }
  WriteRunningCounts(r);
  PodsState state = PlanPods(r);
  HoldWithoutPodGroup(r, state);
  const PodWaits waits = WhyPodsWait(r, state);
  DecidePhase(r, state);
  Conclude(r);
  WriteWaitConditions(r, waits);
  PlanResize(r, static_cast<int>(Int(job, {"spec", "workers", "replicas"}).value_or(world.workers.replicas)),
             static_cast<int>(Int(job, {"spec", "servers", "replicas"}).value_or(world.servers.replicas)),
             At(job, {"spec", "elastic", "minServers"}) || At(job, {"spec", "elastic", "maxServers"}));
  return std::move(r.plan);
}

}  // namespace trellis::op
