#include "operator/job_restart.h"

#include <set>

#include "operator/progress_status.h"

namespace trellis::op {
namespace {

// Every pod of the job not already being deleted, nor by this round, is deleted this round.
void RemoveEveryPod(PlanRound& r) {
  std::set<std::string> removing(r.plan.remove.begin(), r.plan.remove.end());
  for (const auto& p : r.pods) {
    if (!p.deleting && !removing.count(p.name)) r.plan.remove.push_back(p.name);
  }
}

}  // namespace

bool OldPodsGoing(const PlanRound& r) { return Bool(r.plan.status, {"lastRestart", "oldPodsGoing"}); }

bool StoppedFromOutside(const PlanRound& r) { return ConditionTrue(r.plan.status, kStoppedFromOutsideCondition); }

void NoteLastRestart(PlanRound& r, const std::string& reason, const std::string& message, bool whole_job) {
  Json last = Json::object();
  last["reason"] = JStr(reason);
  last["message"] = JStr(Truncate(message, 1024));
  last["time"] = JStr(FormatTime(r.now));
  last["wholeJob"] = Json::boolean(whole_job);
  r.plan.status["lastRestart"] = last;
}

void RestartWholeJob(PlanRound& r, const std::string& reason, const std::string& message, bool counted) {
  RemoveEveryPod(r);
  if (counted) ++r.restarts.job;
  NoteLastRestart(r, reason, message, /*whole_job=*/true);
  r.plan.status["lastRestart"]["oldPodsGoing"] = Json::boolean(true);
  if (StoppedFromOutside(r)) {  // answered: the new run is not being stopped
    SetCondition(r.plan.status, kStoppedFromOutsideCondition, false, reason, "job " + r.name + " restarted as a whole",
                 r.now);
  }
  r.restarted = true;
  r.reason = reason;
  r.message = message;
  r.plan.events.push_back({"Warning", reason, message});
}

void RestartStoppedJob(PlanRound& r) {
  if (!r.phase.empty() || r.restarted || OldPodsGoing(r)) return;
  if (r.old_phase != kRunning && r.old_phase != kRestarting) return;
  std::set<std::string> removing(r.plan.remove.begin(), r.plan.remove.end());
  int going = 0, workers = 0;
  bool seen_deleting = false;
  for (const DesiredPod& d : r.desired) {
    if (d.role != PodRole::kWorker) continue;
    auto it = r.observed.find(d.name);
    ++workers;
    const bool deleting = it != r.observed.end() && (it->second->deleting || removing.count(d.name) > 0);
    seen_deleting = seen_deleting || deleting;
    going += it == r.observed.end() || deleting ? 1 : 0;
  }
  // Also when every pod is going already (the whole job deleted at once): the mark keeps the new
  // pods away from the old scheduler until it is gone. While Restarting, missing pods may be new
  // ones not seen yet: only a deletion seen says the workers are being stopped.
  const bool every_worker = workers > 0 && going == workers && (r.old_phase == kRunning || seen_deleting);
  if (!every_worker && !StoppedFromOutside(r)) return;
  const std::string why = every_worker ? "every worker pod is gone or being deleted (deleted, evicted, or its "
                                         "node drained): the job stops as a whole"
                                       : "its scheduler stops the job as a whole (every worker's pod was "
                                         "stopped from outside)";
  RestartWholeJob(r, "JobPreempted",
                  "job " + r.name + ": " + why + " (rank 0 writes an exit checkpoint when it runs a Checkpointer), "
                  "every pod goes, and the whole job is created again once they are gone, resuming from the "
                  "newest checkpoint (not counted toward backoffLimit)",
                  /*counted=*/false);
}

bool HoldForOldPods(PlanRound& r, PodsState& state) {
  if (!OldPodsGoing(r)) return false;
  RemoveEveryPod(r);
  if (!r.pods.empty()) {
    state.all_up = false;
    return true;
  }
  r.plan.status["lastRestart"]["oldPodsGoing"] = Json::boolean(false);
  return false;
}

}  // namespace trellis::op
