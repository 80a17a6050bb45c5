#include "operator/plan_phases.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "common/process/exit_codes.h"
#include "operator/elastic_resize.h"
#include "operator/job_restart.h"
#include "operator/progress_status.h"
#include "operator/server_takeover.h"

namespace trellis::op {
namespace {

Json StatusOf(const Json& job) {
  const Json* status = At(job, {"status"});
  return status && status->is_object() ? *status : Json::object();
}

// Failed pods, the one that failed first first (its container's finishedAt; then by name): when
// one worker's crash makes the others fail too, the job's message names the one that crashed.
std::vector<const ObservedPod*> FailedFirst(const std::vector<ObservedPod>& pods) {
  std::vector<const ObservedPod*> out;
  for (const auto& p : pods) {
    if (p.phase == "Failed" && !p.deleting) out.push_back(&p);
  }
  auto key = [](const ObservedPod* p) {
    const auto t = ParseTime(p->finished_at);
    // Fractions (MicroTime) break ties within a second when the server writes them.
    const size_t dot = p->finished_at.find('.');
    const std::string frac = dot == std::string::npos ? "" : p->finished_at.substr(dot);
    return std::make_tuple(!t.has_value(), t.value_or(Clock::time_point{}), frac, p->name);
  };
  std::stable_sort(out.begin(), out.end(), [&](const ObservedPod* a, const ObservedPod* b) { return key(a) < key(b); });
  return out;
}

// The first pod failure of the job, kept in status.firstFailure: when a later one ends the job
// (often a consequence), the job's message still names what went wrong first.
void NoteFailure(Json& st, const std::string& what) {
  if (!At(st, {"firstFailure"})) st["firstFailure"] = JStr(Truncate(what, 1024));
}
std::string FirstFailureIfOther(const Json& st, const std::string& what) {
  const std::string first = Str(st, {"firstFailure"});
  return first.empty() || first == Truncate(what, 1024) ? std::string() : "; the first failure: " + first;
}

// The failed pods of a round, and the first of them whose agent found the job already failed at
// the scheduler (its termination report; null: none).
struct Failures {
  std::vector<const ObservedPod*> failed;  // FailedFirst
  const ObservedPod* told = nullptr;
};

// A pod's agent told that the scheduler failed the job: no replacement pod could join the job,
// so where a pod would be recreated the job fails instead, naming the first failure and how it
// failed (an OOM kill, a missing command), not the exits that followed from it; under
// runPolicy.failurePolicy RestartJob the whole job restarts instead, until backoffLimit.
void FailTold(PlanRound& r, const Failures& f) {
  const ObservedPod& first = *f.failed.front();
  const std::string what = Describe(first) + " " + HowItFailed(first);
  const std::string earlier = FirstFailureIfOther(r.plan.status, what);
  NoteFailure(r.plan.status, what);
  const std::string told = "the job's scheduler failed the job (" + Truncate(f.told->report.job_failed, 1024) + ")";
  if (r.spec.runPolicy.failurePolicy == FailurePolicy::kRestartJob) {
    const int limit = r.spec.runPolicy.backoffLimit;
    if (r.restarts.BackoffTotal() >= limit) {
      r.Finish(kFailed, "BackoffLimitExceeded",
               "job " + r.name + ": " + what + earlier + "; " + told + " after " +
                   std::to_string(r.restarts.BackoffTotal()) + " restarts (backoffLimit " + std::to_string(limit) + ")");
      return;
    }
    RestartWholeJob(r, "JobRestarted",
                    "job " + r.name + ": " + what + earlier + "; " + told +
                        "; restarting every pod, from the newest checkpoint (runPolicy.failurePolicy RestartJob; "
                        "restart " + std::to_string(r.restarts.BackoffTotal() + 1) + " of at most " +
                        std::to_string(limit) + ")",
                    /*counted=*/true);
    return;
  }
  r.Finish(kFailed, FailureReason(first, "PodFailed"),
           "job " + r.name + ": " + what + earlier + "; " + told + ", so no pod is recreated: none could join it");
}

// `p` is deleted this round to be recreated: the phase is Restarting, with a Warning event of
// its own.
void Replace(PlanRound& r, const ObservedPod& p, const std::string& reason, const std::string& message) {
  r.plan.remove.push_back(p.name);
  NoteLastRestart(r, reason, message, /*whole_job=*/false);
  r.restarted = true;
  r.reason = reason;
  r.message = message;
  r.plan.events.push_back({"Warning", reason, message});
}

// A failure backoffLimit counts (`what`; `earlier`: the job's first failure when another): the
// job fails with `limit_reason` once the pods' restarts reach the limit, else `p` is replaced
// ("<recreating> (restart N of at most L)"), unless a pod told that the job failed already.
void ReplaceCounted(PlanRound& r, const ObservedPod& p, const Failures& f, const std::string& what,
                    const std::string& earlier, const char* limit_reason, const char* event_reason,
                    const std::string& recreating) {
  const int limit = r.spec.runPolicy.backoffLimit;
  if (r.restarts.BackoffTotal() >= limit) {
    r.Finish(kFailed, limit_reason,
             "job " + r.name + ": " + what + " after " + std::to_string(r.restarts.BackoffTotal()) +
                 " restarts (backoffLimit " + std::to_string(limit) + ")" + earlier);
    return;
  }
  if (f.told) return FailTold(r, f);
  ++r.restarts.pods[p.role];
  Replace(r, p, event_reason,
          "job " + r.name + ": " + what + "; " + recreating + " (restart " +
              std::to_string(r.restarts.BackoffTotal()) + " of at most " + std::to_string(limit) + ")");
}

// A new scheduler pod (same Service) recovers the running job from its members
// (docs/scheduler.md#scheduler-restart); only one that keeps failing fails the job.
void OnSchedulerFailed(PlanRound& r, const ObservedPod& p, const Failures& f) {
  const std::string what = Describe(p) + " " + HowItFailed(p);
  const std::string earlier = FirstFailureIfOther(r.plan.status, what);
  NoteFailure(r.plan.status, what);
  ReplaceCounted(r, p, f, what, earlier, "SchedulerFailed", "SchedulerRestarted",
                 "recreating it, the running job's members hand its state back");
}

// Evicted, not failed: as Kubernetes Jobs with a DisruptionTarget podFailurePolicy rule,
// recreated without counting toward backoffLimit; its replacement rejoins the job.
void OnPodDisrupted(PlanRound& r, const ObservedPod& p, RestartPolicy policy, const Failures& f) {
  if (policy == RestartPolicy::kNever) {
    r.Finish(kFailed, "PodDeleted",
             "job " + r.name + ": " + Describe(p) + " was evicted (" + p.disruption +
                 ") while the job ran (restartPolicy Never does not replace it)");
    return;
  }
  if (f.told) return FailTold(r, f);
  Replace(r, p, "PodEvicted",
          "job " + r.name + ": " + Describe(p) + " was evicted (" + p.disruption +
              "); recreating it (not counted toward backoffLimit)");
}

// A server or worker whose program failed: replaced until backoffLimit, unless its role's
// policy, or how it failed, says a new pod cannot do better.
void OnPodFailed(PlanRound& r, const ObservedPod& p, RestartPolicy policy, const Failures& f) {
  const std::string what = Describe(p) + " " + HowItFailed(p);
  const std::string earlier = FirstFailureIfOther(r.plan.status, what);
  NoteFailure(r.plan.status, what);
  const bool not_found = !p.report.command_not_found.empty();
  const bool permanent = policy == RestartPolicy::kNever ||
                         (policy == RestartPolicy::kExitCode && p.exit_code >= 1 && p.exit_code < kExitSignalBase) ||
                         p.exit_code == kExitConfigurationError ||  // restarting cannot fix it
                         not_found;                                  // nor a missing command
  if (permanent) {
    // An elastic job goes on without a worker unless too few would remain: the scheduler's why.
    const std::string told = r.spec.elastic.enabled && !p.report.job_failed.empty()
                                 ? "; the job's scheduler failed the job: " + Truncate(p.report.job_failed, 1024)
                                 : "";
    r.Finish(kFailed, FailureReason(p, "PodFailed"),
             "job " + r.name + ": " + what +
                 (not_found ? std::string(" (a new pod of the same image cannot find it either)")
                            : " (restartPolicy " + std::string(ToString(policy)) + ")") +
                 told + earlier);
    return;
  }
  ReplaceCounted(r, p, f, what, earlier, "BackoffLimitExceeded", "PodRestarted", "recreating it");
}

// The restart policy of a server or worker pod.
RestartPolicy RolePolicy(const JobSpec& spec, PodRole role) {
  return spec.RestartPolicyFor(role == PodRole::kServer ? spec.servers : spec.workers);
}

// The first pod of `pods` for which `field` is set, and how many have it (pods being deleted
// left out).
std::pair<const ObservedPod*, int> FirstWith(const std::vector<ObservedPod>& pods,
                                             std::string ObservedPod::*field) {
  const ObservedPod* first = nullptr;
  int n = 0;
  for (const auto& p : pods) {
    if (p.deleting || (p.*field).empty()) continue;
    if (!first) first = &p;
    ++n;
  }
  return {first, n};
}

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// A worker of an elastic job outside its world (operator/elastic_resize.h): resized away, it
// finishes its last step and exits; its end is not the job's.
bool Departed(const PlanRound& r, const ObservedPod& p) {
  return r.spec.elastic.enabled && p.role == PodRole::kWorker && !Contains(r.worker_slots, p.index);
}

bool Ended(const ObservedPod& p) { return p.phase == "Succeeded" || p.phase == "Failed"; }

// A server a server shrink removed (the last resize, Done: docs/elastic.md#servers): it hands its
// slices over at the workers' next step boundary and then exits 0 by itself; its pod is kept
// until it ended.
bool ServerLeaving(const PlanRound& r, const ObservedPod& p) {
  if (!r.spec.elastic.enabled || p.role != PodRole::kServer || p.index < r.spec.servers.replicas) return false;
  const Json& st = r.plan.status;
  return ServersResize(st) && Str(st, {"lastResize", "outcome"}) == kResizeDone &&
         p.index < Int(st, {"lastResize", "from"}).value_or(0);
}

// An elastic job's server beyond the servers the round plans for (its world's, or a grow's under
// way): removed by a shrink, or added by a grow that was given up.
bool ServerOutsideWorld(const PlanRound& r, const ObservedPod& p) {
  return r.spec.elastic.enabled && p.role == PodRole::kServer && p.index >= r.spec.servers.replicas;
}

// A server a server grow under way adds (docs/elastic.md#servers): its pod is made now, not lost.
bool ServerJoining(const PlanRound& r, const DesiredPod& d) {
  if (!r.spec.elastic.enabled || d.role != PodRole::kServer) return false;
  const Json& st = r.plan.status;
  const auto servers = Int(st, {"world", "servers"});
  return ServersResize(st) && Str(st, {"lastResize", "outcome"}) == kResizePending && servers && d.index >= *servers;
}

// A worker a grow under way brings back (elastic_resize.h), or a server a server grow adds: its
// pod is made now, not lost.
bool Joining(const PlanRound& r, const DesiredPod& d) {
  return (r.spec.elastic.enabled && d.role == PodRole::kWorker && !r.members.empty() &&
          !Contains(r.members, d.index)) ||
         ServerJoining(r, d);
}

// An elastic job's worker whose pod was deleted (or is being deleted: a spot node reclaimed,
// `kubectl delete pod`, a drain) under restartPolicy Never while the job ran. No replacement
// comes; its scheduler loses the worker (its agent reports the stop, or it falls silent) and the
// job goes on with the others (docs/elastic.md#losing-a-worker): the operator neither fails the
// job nor makes the pod again.
bool GoneForGood(const PlanRound& r, const DesiredPod& d) {
  if (!r.spec.elastic.enabled || d.role != PodRole::kWorker || Joining(r, d)) return false;
  if (RolePolicy(r.spec, d.role) != RestartPolicy::kNever) return false;
  if (r.old_phase != kRunning && r.old_phase != kRestarting) return false;  // not made yet, rather
  auto it = r.observed.find(d.name);
  if (it == r.observed.end()) return true;
  const ObservedPod& p = *it->second;
  return p.deleting || (p.phase == "Failed" && !p.disruption.empty());  // evicted: Failed, kept
}
bool GoneForGood(const PlanRound& r, const ObservedPod& p) {
  return p.role == PodRole::kWorker && Contains(r.worker_slots, p.index) &&
         GoneForGood(r, DesiredPod{.name = p.name, .role = p.role, .index = p.index});
}

// A rank its scheduler lost that a new pod may bring back (a policy that replaces pods): the
// world has left it, and when such a pod's program asks to join the world grows back.
bool Replaceable(const PlanRound& r, int slot) {
  return r.spec.elastic.enabled && RolePolicy(r.spec, PodRole::kWorker) != RestartPolicy::kNever &&
         Contains(LostSlots(r.plan.status), slot) && !Contains(r.worker_slots, slot);
}
// That pod: one made again before the loss that waited for a node past
// registrationTimeoutSeconds, or the replacement of a silent worker's deleted pod (not the
// frozen pod itself).
bool LateReplacement(const PlanRound& r, const ObservedPod& p) {
  if (p.role != PodRole::kWorker || !Replaceable(r, p.index)) return false;
  if (!LostSilently(r.plan.status, p.index)) return true;
  const std::string frozen = DeletedSilentPod(r.plan.status, p.index);
  return !frozen.empty() && p.uid != frozen;
}

// The world's workers that may still train: neither gone for good, lost, nor joining.
int WorkersLeft(const PlanRound& r) {
  const std::vector<int> lost = LostSlots(r.plan.status);
  int left = 0;
  for (const DesiredPod& d : r.desired) {
    if (d.role != PodRole::kWorker || Joining(r, d) || GoneForGood(r, d) || Contains(lost, d.index)) continue;
    auto it = r.observed.find(d.name);
    left += it == r.observed.end() || !LostWorker(r.spec, *it->second);
  }
  return left;
}

}  // namespace

bool Terminal(const std::string& phase) { return phase == kSucceeded || phase == kFailed; }

PlanRound::PlanRound(const Json& job, const JobSpec& spec_in, const std::vector<ObservedPod>& pods_in,
                     Clock::time_point now_in, const GangObservation* gang_in)
    : spec(spec_in),
      name(spec_in.name),
      pods(pods_in),
      generation(Int(job, {"metadata", "generation"}).value_or(0)),
      members(WorldMembers(StatusOf(job))),
      worker_slots(WorkerSlots(spec_in, job)),
      desired(DesiredPodList(spec_in.name, spec_in, worker_slots)),
      now(now_in),
      gang(gang_in),
      old_phase(Str(job, {"status", "phase"})) {
  for (const auto& p : pods) observed[p.name] = &p;
  plan.status = StatusOf(job);
  restarts = ReadRestarts(plan.status);
}

void PlanRound::Finish(const std::string& end, const std::string& why, const std::string& what) {
  phase = end;
  reason = why;
  message = what;
  if (!At(plan.status, {"completionTime"})) plan.status["completionTime"] = JStr(FormatTime(now));
}

void EndJob(PlanRound& r) {
  Json& st = r.plan.status;
  // Pods being restarted this very round are dropped: the job is over.
  r.plan.remove = CleanUp(r.spec.runPolicy.cleanPodPolicy, r.pods);
  r.plan.events.clear();
  EndResize(st, r.name, "the job ended", r.now);
  WriteCounts(st, CountPods(r.pods, {r.plan.remove.begin(), r.plan.remove.end()}), r.restarts, r.spec,
              /*keep_finished=*/true);
  FinishProgress(st, r.phase == kSucceeded, r.now);
  r.plan.requeue_after.reset();
  if (const auto ttl = r.spec.runPolicy.ttlSecondsAfterFinished) {
    if (const auto done = ParseTime(Str(st, {"completionTime"}))) {
      const auto expiry = *done + std::chrono::seconds(*ttl);
      if (r.now >= expiry) {
        r.plan.delete_job = true;
      } else {
        r.plan.requeue_after = expiry - r.now;
      }
    }
  }
  Conclude(r);
}

void Suspend(PlanRound& r) {
  Json& st = r.plan.status;
  EndResize(st, r.name, "the job was suspended", r.now);
  for (const auto& p : r.pods) {
    if (!p.deleting) r.plan.remove.push_back(p.name);
  }
  WriteCounts(st, CountPods(r.pods, {r.plan.remove.begin(), r.plan.remove.end()}), r.restarts, r.spec,
              /*keep_finished=*/false);
  // The deadline counts running time: a resumed job starts its clock again.
  if (st.has_field("startTime")) st.erase("startTime");
  // Every pod goes anyway; a resumed job creates the new set at once, and is not being stopped.
  if (OldPodsGoing(r)) st["lastRestart"]["oldPodsGoing"] = Json::boolean(false);
  if (StoppedFromOutside(r)) {
    SetCondition(st, kStoppedFromOutsideCondition, false, "JobSuspended", "job " + r.name + " is suspended", r.now);
  }
  r.phase = kSuspended;
  r.reason = "JobSuspended";
  r.message = "job " + r.name + " is suspended: its pods are deleted until spec.runPolicy.suspend is false";
  Conclude(r);
  UpdateWaitCondition(r.plan, kUnschedulable, {}, {r.reason, r.message}, r.now);
}

void StartClock(PlanRound& r) {
  Json& st = r.plan.status;
  if (r.old_phase == kSuspended) {
    r.reason = "JobResumed";
    r.message = "job " + r.name + " resumed";
  }
  if (!At(st, {"startTime"})) st["startTime"] = JStr(FormatTime(r.now));
  const auto start = ParseTime(Str(st, {"startTime"})).value_or(r.now);
  const auto& limit = r.spec.runPolicy.activeDeadlineSeconds;
  if (!limit) return;
  const auto deadline = start + std::chrono::seconds(*limit);
  if (r.now >= deadline) {
    r.Finish(kFailed, "DeadlineExceeded",
             "job " + r.name + " ran longer than activeDeadlineSeconds (" + std::to_string(*limit) + "s)");
  } else {
    r.plan.requeue_after = deadline - r.now;
  }
}

void FailLostPods(PlanRound& r) {
  if (!r.phase.empty() || r.old_phase != kRunning) return;
  for (const DesiredPod& d : r.desired) {
    if (d.role == PodRole::kScheduler) continue;
    if (GoneForGood(r, d)) {
      const int left = WorkersLeft(r);
      if (left >= r.spec.elastic.minWorkers) continue;  // the job goes on without it
      r.Finish(kFailed, "PodDeleted",
               "job " + r.name + ": worker " + std::to_string(d.index) + " (pod " + d.name +
                   ") was deleted or evicted while the job ran (restartPolicy Never does not replace it), and " +
                   std::to_string(left) + " worker(s) are left, fewer than spec.elastic.minWorkers (" +
                   std::to_string(r.spec.elastic.minWorkers) + ")");
      return;
    }
    if (RolePolicy(r.spec, d.role) != RestartPolicy::kNever || Joining(r, d)) continue;
    if (ServerTakenOver(r, d)) continue;  // elastic servers: another server's pod takes it over
    auto it = r.observed.find(d.name);
    if (it != r.observed.end() && !it->second->deleting) continue;
    r.Finish(kFailed, "PodDeleted",
             "job " + r.name + ": " + RoleName(d.role) + " " + std::to_string(d.index) + " (pod " + d.name +
                 ") was deleted or evicted while the job ran (restartPolicy Never does not replace it)");
    return;
  }
}

void DecideFailures(PlanRound& r) {
  if (OldPodsGoing(r)) return;  // every old pod is going already: their failures are the old run's
  Failures f;
  f.failed = FailedFirst(r.pods);
  for (const ObservedPod* p : f.failed) {
    if (!p->report.job_failed.empty()) {
      f.told = p;
      break;
    }
  }
  for (const ObservedPod* failed : f.failed) {
    if (!r.phase.empty() || OldPodsGoing(r)) break;  // the job ended, or restarts as a whole
    const ObservedPod& p = *failed;
    if (Departed(r, p)) continue;  // PlanPods deletes it; nothing to replace
    // An elastic job's server outside its world's servers (removed by a shrink, or added by a
    // grow given up) and one a grow under way adds that failed before it was ready: its agent
    // told the scheduler, which gives the grow up; the job runs on, PlanPods deletes the pod.
    if (ServerOutsideWorld(r, p) || ServerJoining(r, DesiredPod{.name = p.name, .role = p.role, .index = p.index})) {
      continue;
    }
    if (LostWorker(r.spec, p)) continue;  // the job goes on without it (NoteLostWorkers)
    if (ServerTakenOver(r, DesiredPod{.name = p.name, .role = p.role, .index = p.index})) {
      continue;  // another server's pod runs its rank now
    }
    if (GoneForGood(r, p)) continue;      // evicted: FailLostPods judged it
    if (p.role == PodRole::kScheduler) {
      OnSchedulerFailed(r, p, f);
      continue;
    }
    const RestartPolicy policy = RolePolicy(r.spec, p.role);
    if (!p.disruption.empty()) {
      OnPodDisrupted(r, p, policy, f);
    } else {
      OnPodFailed(r, p, policy, f);
    }
  }
}

void DecideSuccess(PlanRound& r) {
  // Of the desired workers (a worker resized away succeeds early), those not lost for good.
  int workers = 0, succeeded = 0;
  for (const DesiredPod& d : r.desired) {
    if (d.role != PodRole::kWorker) continue;
    auto it = r.observed.find(d.name);
    if (it != r.observed.end() && LostWorker(r.spec, *it->second)) continue;
    if (GoneForGood(r, d)) continue;
    ++workers;
    succeeded += it != r.observed.end() && it->second->phase == "Succeeded";
  }
  if (r.phase.empty() && workers > 0 && succeeded >= workers) {
    r.Finish(kSucceeded, "JobSucceeded", "job " + r.name + ": all " + std::to_string(workers) + " workers succeeded");
  }
}

void WriteRunningCounts(PlanRound& r) {
  WriteCounts(r.plan.status, CountPods(r.pods, {}), r.restarts, r.spec, /*keep_finished=*/false);
}

PodsState PlanPods(PlanRound& r) {
  PodsState state;
  r.plan.ensure_support = true;
  if (HoldForOldPods(r, state)) return state;
  std::set<std::string> removing(r.plan.remove.begin(), r.plan.remove.end());
  std::set<std::string> wanted;
  for (const DesiredPod& d : r.desired) wanted.insert(d.name);
  for (const auto& p : r.pods) {
    // Finishing its last step. One that never started (a grow's joiner whose grow was given up)
    // has nothing to finish: deleted. So is one lost while silent (frozen, its node gone): it
    // would never finish, and its replacement, should a grow want the slot, needs its name.
    if (Departed(r, p) && !Ended(p) && p.phase != "Pending" && !LostSilently(r.plan.status, p.index)) continue;
    if (ServerLeaving(r, p) && !Ended(p) && p.phase != "Pending") continue;
    // A lost worker's replacement waiting for a node (a policy that replaces pods): once its
    // program is up it asks to join and the scheduler grows the world back to take it in. Kept
    // when it ended too (it stayed out: the job was ending), or it would be made again and again.
    if (Departed(r, p) && !p.deleting && LateReplacement(r, p)) continue;
    // Lost for good: kept for its logs (cleanPodPolicy decides at the end) until a grow wants
    // its slot again.
    if (LostWorker(r.spec, p) && !wanted.count(p.name)) continue;
    if (!wanted.count(p.name) && !p.deleting && !removing.count(p.name)) {
      r.plan.remove.push_back(p.name);
      removing.insert(p.name);
      if (Departed(r, p) && LostSilently(r.plan.status, p.index)) NoteSilentPodDeleted(r.plan.status, p.index, p.uid);
    }
  }
  // The replacement of a silent worker's deleted pod (its node gone), made once that pod is gone;
  // when it runs, its program asks to join and the world grows back. It holds nothing back.
  for (int slot : LostSlots(r.plan.status)) {
    const DesiredPod d{.name = PodName(r.name, PodRole::kWorker, slot), .role = PodRole::kWorker, .index = slot};
    if (Replaceable(r, slot) && !DeletedSilentPod(r.plan.status, slot).empty() && !r.observed.count(d.name)) {
      r.plan.create.push_back(d);
    }
  }
  for (const DesiredPod& d : r.desired) {
    auto it = r.observed.find(d.name);
    // A joiner's pod coming up does not hold the running job back (the grow waits for it).
    const bool joining = Joining(r, d);
    // Not made again, not waited for: its scheduler loses it and the others train on.
    if (GoneForGood(r, d)) continue;
    if (ServerTakenOver(r, d)) continue;  // likewise: another server's pod runs its rank
    if (it == r.observed.end()) {
      r.plan.create.push_back(d);
      if (!joining) state.all_up = false;
      continue;
    }
    const ObservedPod& p = *it->second;
    if (LostWorker(r.spec, p)) {
      // Neither up nor missing: the job runs without it. A grow bringing its slot back makes
      // the pod again once this one is gone.
      if (joining && !p.deleting && !removing.count(d.name)) {
        r.plan.remove.push_back(p.name);
        removing.insert(p.name);
      }
      continue;
    }
    const bool up = p.phase == "Running" || (p.role == PodRole::kWorker && p.phase == "Succeeded");
    if ((!up && !joining) || p.deleting || removing.count(d.name)) state.all_up = false;
    if (p.deleting && !removing.count(d.name) && state.going.empty()) state.going = d.name;
  }
  return state;
}

void HoldWithoutPodGroup(PlanRound& r, PodsState& state) {
  if (!r.gang || r.gang->create_error.empty()) return;
  r.plan.create.clear();
  state.all_up = false;
}

PodWaits WhyPodsWait(const PlanRound& r, const PodsState& state) {
  PodWaits waits;
  Wait& unschedulable = waits.unschedulable;
  if (r.gang && !r.gang->create_error.empty()) {
    unschedulable = {"PodGroupNotCreated", "job " + r.name + ": " + r.gang->create_error};
  } else if (!state.all_up && r.gang && !r.gang->unschedulable_reason.empty()) {
    unschedulable = {"PodGroupUnschedulable",
                     "job " + r.name + ": PodGroup " + PodGroupName(r.name) + ": " + r.gang->unschedulable_reason +
                         (r.gang->unschedulable_message.empty() ? "" : ": " + r.gang->unschedulable_message)};
  } else if (!state.all_up) {
    if (const auto [first, n] = FirstWith(r.pods, &ObservedPod::unschedulable); first) {
      unschedulable = {"PodsUnschedulable", "job " + r.name + ": " + std::to_string(n) + " of " +
                                                std::to_string(r.desired.size()) + " pods cannot be scheduled; " +
                                                Describe(*first) + ": " + first->unschedulable};
    }
  }
  // Pods placed whose container cannot start (an image that cannot be pulled, a missing
  // Secret): the job would wait for them for ever; say why.
  if (!state.all_up) {
    if (const auto [first, n] = FirstWith(r.pods, &ObservedPod::cannot_start); first) {
      waits.cannot_start = {first->cannot_start_reason,
                            "job " + r.name + ": pod " + first->name + " cannot start: " + first->cannot_start +
                                (n > 1 ? " (and " + std::to_string(n - 1) + " more pods cannot start)" : "")};
    }
  }
  return waits;
}

void DecidePhase(PlanRound& r, const PodsState& state) {
  const std::vector<DesiredPod>& create = r.plan.create;
  // A pod made again (a joiner's is made for a grow, not lost).
  const auto lost = std::find_if(create.begin(), create.end(),
                                 [&](const DesiredPod& d) {
                                   return !Joining(r, d) && !(d.role == PodRole::kWorker && Replaceable(r, d.index));
                                 });
  if (r.restarted) {
    r.phase = kRestarting;
  } else if (r.old_phase == kRunning && (lost != create.end() || !state.going.empty())) {
    // A pod of the running job is gone, or seen while its deletion is under way (deleted,
    // evicted, drained): the job is replacing it, not waiting for its first pods; not counted.
    r.phase = kRestarting;
    r.reason = "PodRecreated";
    r.message = lost != create.end()
                    ? "job " + r.name + ": pod " + lost->name +
                          " is gone (deleted or evicted); recreating it (not counted toward "
                          "backoffLimit)"
                    : "job " + r.name + ": pod " + state.going +
                          " is being deleted (or evicted); it is recreated once gone (not counted "
                          "toward backoffLimit)";
  } else if (state.all_up) {
    r.phase = kRunning;
    if (r.reason.empty() || r.old_phase != kRunning) {
      r.reason = "JobRunning";
      r.message = "job " + r.name + ": all pods are running";
    }
  } else if (r.old_phase == kRestarting) {
    r.phase = kRestarting;  // until every pod is back up
  } else {
    r.phase = kPending;
    if (r.reason.empty()) {
      r.reason = "JobCreated";
      r.message = "job " + r.name + ": creating and waiting for pods";
    }
  }
}

void Conclude(PlanRound& r) { ConcludePhase(r.plan, r.old_phase, r.phase, r.reason, r.message, r.now); }

void WriteWaitConditions(PlanRound& r, const PodWaits& waits) {
  UpdateWaitCondition(r.plan, kUnschedulable, waits.unschedulable,
                      {"PodsScheduled", "job " + r.name + ": every pod has been scheduled"}, r.now);
  UpdateWaitCondition(r.plan, kCannotStart, waits.cannot_start,
                      {"ContainersStarted", "job " + r.name + ": the containers of every pod have started"}, r.now);
}

}  // namespace trellis::op
