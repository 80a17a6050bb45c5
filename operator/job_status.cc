#include "operator/job_status.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "common/process/exit_codes.h"
#include "operator/progress_status.h"

namespace trellis::op {
namespace {

struct RoleCounts {
  int active = 0;  // Pending or Running
  int running = 0;
  int succeeded = 0;
  int failed = 0;
};

Json CountsJson(const RoleCounts& c, int restarts) {
  Json j = Json::object();
  j["active"] = Json::number(c.active);
  j["running"] = Json::number(c.running);
  j["succeeded"] = Json::number(c.succeeded);
  j["failed"] = Json::number(c.failed);
  j["restarts"] = Json::number(restarts);
  return j;
}

bool Terminal(const std::string& phase) { return phase == kSucceeded || phase == kFailed; }

// The pods cleanPodPolicy deletes once the job has ended.
std::vector<std::string> CleanUp(CleanPodPolicy policy, const std::vector<ObservedPod>& pods) {
  std::vector<std::string> out;
  for (const auto& p : pods) {
    if (p.deleting) continue;
    const bool running = p.phase == "Pending" || p.phase == "Running" || p.phase == "Unknown";
    if (policy == CleanPodPolicy::kAll || (policy == CleanPodPolicy::kRunning && running)) out.push_back(p.name);
  }
  return out;
}

// Counts pods by role. Pods being deleted (deletionTimestamp, or deleted by this very plan) are
// neither active nor running: after the end, and while suspended, the status shows what is left.
std::map<PodRole, RoleCounts> Count(const std::vector<ObservedPod>& pods, const std::set<std::string>& removing) {
  std::map<PodRole, RoleCounts> counts;
  for (const auto& p : pods) {
    RoleCounts& c = counts[p.role];
    const bool going = p.deleting || removing.count(p.name) > 0;
    if (p.phase == "Running" && !going) ++c.running;
    if ((p.phase == "Pending" || p.phase == "Running" || p.phase == "Unknown") && !going) ++c.active;
    if (p.phase == "Succeeded") ++c.succeeded;
    if (p.phase == "Failed") ++c.failed;
  }
  return counts;
}

// Writes replicaStatuses, restarts and the WORKERS/SERVERS columns. A role's restarts are its
// pods' replacements (`restarts`) and its programs' restarts inside their pods (`program`, which
// the progress poller counts from the scheduler; kept as programRestarts). `keep_finished`: the
// job has ended, its pods are being cleaned up; succeeded/failed counts never go down then.
void WriteCounts(Json& st, std::map<PodRole, RoleCounts> counts, const std::map<PodRole, int>& restarts,
                 const std::map<PodRole, int>& program, const JobSpec& js, bool keep_finished) {
  const std::pair<PodRole, const char*> roles[] = {
      {PodRole::kScheduler, "scheduler"}, {PodRole::kServer, "server"}, {PodRole::kWorker, "worker"}};
  Json rs = Json::object();
  int total_restarts = 0;
  for (const auto& role_key : roles) {
    const PodRole role = role_key.first;
    const char* const key = role_key.second;  // not a structured binding: clang 14 cannot capture one
    RoleCounts& c = counts[role];
    if (keep_finished) {
      auto before = [&](const char* f) {
        return static_cast<int>(std::clamp<int64_t>(Int(st, {"replicaStatuses", key, f}).value_or(0), 0, 1 << 24));
      };
      c.succeeded = std::max(c.succeeded, before("succeeded"));
      c.failed = std::max(c.failed, before("failed"));
    }
    const int in_pods = program.count(role) ? program.at(role) : 0;
    const int r = (restarts.count(role) ? restarts.at(role) : 0) + in_pods;
    total_restarts += r;
    rs[key] = CountsJson(c, r);
    if (in_pods > 0) rs[key]["programRestarts"] = Json::number(in_pods);
  }
  st["replicaStatuses"] = rs;
  st["restarts"] = Json::number(total_restarts);
  st["workers"] = JStr(std::to_string(counts[PodRole::kWorker].running + counts[PodRole::kWorker].succeeded) +
                       "/" + std::to_string(js.workers.replicas));
  st["servers"] = JStr(std::to_string(counts[PodRole::kServer].running) + "/" +
                       std::to_string(js.servers.replicas));
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

std::string Describe(const ObservedPod& p) {
  std::string s = RoleName(p.role);
  if (p.role != PodRole::kScheduler) s += " " + std::to_string(p.index);
  s += " (pod " + p.name + ")";
  return s;
}

constexpr char kUnschedulable[] = "Unschedulable";
// A pod's container cannot start: its image cannot be pulled, its configuration is refused.
constexpr char kCannotStart[] = "CannotStart";

// A waiting condition (Unschedulable, CannotStart): True with `reason` and `message` while
// something keeps the job's pods from being placed or started (reason empty: nothing does).
// Jobs that never waited never get it; once True, it turns False with `clear_reason` when the
// wait ends. Turning True is a Warning event (the phase's, unless the plan already has a
// Warning there).
void UpdateWaitCondition(Json& st, JobPlan& plan, const char* type, const std::string& reason,
                         std::string message, const std::string& clear_reason,
                         const std::string& clear_message, Clock::time_point now) {
  bool was_true = false;
  if (const Json* conds = At(st, {"conditions"}); conds && conds->is_array()) {
    for (size_t i = 0; i < conds->size(); ++i) {
      if (Str(conds->at(i), {"type"}) != type) continue;
      was_true = Str(conds->at(i), {"status"}) == "True";
    }
  }
  if (reason.empty()) {
    if (was_true) SetCondition(st, type, false, clear_reason, clear_message, now);
    return;
  }
  // Schedulers' messages list every node's reason; the status keeps a readable head.
  constexpr size_t kMaxMessage = 1024;
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage - 3) + "...";
  SetCondition(st, type, true, reason, message, now);
  if (was_true) return;
  if (plan.event_type != "Warning") {
    plan.event_type = "Warning";
    plan.event_reason = reason;
    plan.event_message = message;
  } else {
    plan.events.push_back({"Warning", reason, message});
  }
}

// The kubelet's reasons for a container that waits and will not start by itself.
bool CannotStartReason(const std::string& r) {
  static const char* const kReasons[] = {"ErrImagePull",          "ImagePullBackOff",     "InvalidImageName",
                                         "ErrImageNeverPull",     "RegistryUnavailable",  "SignatureValidationFailed",
                                         "CreateContainerConfigError", "CreateContainerError", "RunContainerError"};
  return std::find(std::begin(kReasons), std::end(kReasons), r) != std::end(kReasons);
}

bool ReportEmpty(const TerminationReport& r) {
  return r.error.empty() && r.command_not_found.empty() && r.exit.empty() && r.restarts == 0 &&
         r.job_failed.empty() && r.program_error.empty();
}

// A condition reason naming how `p` failed, else `fallback`.
std::string FailureReason(const ObservedPod& p, const std::string& fallback) {
  if (p.terminated_reason == "OOMKilled") return "OOMKilled";
  if (!p.report.command_not_found.empty()) return "CommandNotFound";
  return fallback;
}

}  // namespace

std::string HowItFailed(const ObservedPod& p) {
  const std::string code = p.exit_code >= 0 ? "exit code " + std::to_string(p.exit_code) : "";
  const std::string in_pod =
      p.report.restarts > 0 ? " after " + std::to_string(p.report.restarts) +
                                  (p.report.restarts == 1 ? " restart" : " restarts") + " inside the pod"
                            : "";
  // The program's own last words ($TRELLIS_ERROR_FILE: "ValueError: boom"), when it left any.
  const std::string program_error =
      p.report.program_error.empty() ? "" : ": " + Truncate(p.report.program_error, 512);
  if (p.terminated_reason == "OOMKilled") {
    return "was OOMKilled (" + (p.memory_limit.empty() ? std::string("no memory limit") : "memory limit " + p.memory_limit) +
           (code.empty() ? "" : "; " + code) + ")" + in_pod + program_error;
  }
  if (!p.report.command_not_found.empty()) {
    return "failed: command not found: " + p.report.command_not_found + (code.empty() ? "" : " (" + code + ")");
  }
  std::string s = "failed" + (code.empty() ? "" : " with " + code);
  if (p.exit_code == 127) {
    s += " (command not found)";
  } else if (!p.terminated_reason.empty() && p.terminated_reason != "Error" && p.terminated_reason != "Completed") {
    s += " (" + p.terminated_reason + ")";
  }
  s += in_pod;
  // The agent's own error, or the container runtime's words (a container that could not run).
  if (!p.report.error.empty()) {
    s += ": " + Truncate(p.report.error, 512);
  } else if (ReportEmpty(p.report) && !p.terminated_message.empty()) {
    s += ": " + Truncate(p.terminated_message, 512);
  }
  return s + program_error;
}

std::optional<ObservedPod> ObservePod(const Json& pod) {
  ObservedPod o;
  o.name = Str(pod, {"metadata", "name"});
  const std::string role = Str(pod, {"metadata", "labels", kLabelRole});
  if (o.name.empty()) return std::nullopt;
  if (role == "scheduler") {
    o.role = PodRole::kScheduler;
  } else if (role == "server" || role == "worker") {
    o.role = role == "server" ? PodRole::kServer : PodRole::kWorker;
    const std::string rank = Str(pod, {"metadata", "labels", kLabelRank});
    if (rank.empty() || rank.size() > 6 || !std::all_of(rank.begin(), rank.end(), ::isdigit)) return std::nullopt;
    o.index = std::stoi(rank);
  } else {
    return std::nullopt;
  }
  o.phase = Str(pod, {"status", "phase"}, "Pending");
  o.deleting = At(pod, {"metadata", "deletionTimestamp"}) != nullptr;
  if (Str(pod, {"status", "reason"}) == "Evicted") o.disruption = "Evicted";
  if (const Json* conds = At(pod, {"status", "conditions"}); conds && conds->is_array()) {
    for (size_t i = 0; i < conds->size(); ++i) {
      const Json& c = conds->at(i);
      if (Str(c, {"type"}) == "DisruptionTarget" && Str(c, {"status"}) == "True") {
        o.disruption = Str(c, {"reason"}, "DisruptionTarget");
      }
    }
  }
  // The agent's container, by name: the kubelet does not keep containerStatuses in spec order,
  // and a sidecar from the pod template may come first.
  if (const Json* cs = At(pod, {"status", "containerStatuses"}); cs && cs->is_array() && cs->size() > 0) {
    const Json* mine = &cs->at(0);
    for (size_t i = 0; i < cs->size(); ++i) {
      if (Str(cs->at(i), {"name"}) == "trellis") mine = &cs->at(i);
    }
    if (auto code = Int(*mine, {"state", "terminated", "exitCode"})) {
      o.exit_code = static_cast<int>(std::clamp<int64_t>(*code, -1, 1 << 16));
      o.finished_at = Str(*mine, {"state", "terminated", "finishedAt"});
      o.terminated_reason = Truncate(Str(*mine, {"state", "terminated", "reason"}), 128);
      o.terminated_message = Truncate(Str(*mine, {"state", "terminated", "message"}), kMaxTerminationMessage);
      o.report = ParseTerminationReport(o.terminated_message);
    }
    const std::string waiting = Str(*mine, {"state", "waiting", "reason"});
    if (CannotStartReason(waiting)) {
      const std::string msg = Truncate(Str(*mine, {"state", "waiting", "message"}), 512);
      o.cannot_start_reason = waiting;
      o.cannot_start = waiting + (msg.empty() ? "" : ": " + msg);
    }
  }
  // The agent's container's memory limit: what an OOM kill is measured against.
  if (const Json* cs = At(pod, {"spec", "containers"}); cs && cs->is_array() && cs->size() > 0) {
    const Json* mine = &cs->at(0);
    for (size_t i = 0; i < cs->size(); ++i) {
      if (Str(cs->at(i), {"name"}) == "trellis") mine = &cs->at(i);
    }
    o.memory_limit = Truncate(Str(*mine, {"resources", "limits", "memory"}), 64);
  }
  // Only a pod still Pending waits for the scheduler; a stale condition on a running one does not.
  if (const Json* conds = At(pod, {"status", "conditions"}); o.phase == "Pending" && conds && conds->is_array()) {
    for (size_t i = 0; i < conds->size(); ++i) {
      const Json& c = conds->at(i);
      if (Str(c, {"type"}) == "PodScheduled" && Str(c, {"status"}) == "False" &&
          Str(c, {"reason"}) == "Unschedulable") {
        o.unschedulable = Str(c, {"message"}, "Unschedulable");
      }
    }
  }
  return o;
}

void SetCondition(Json& status, const std::string& type, bool value, const std::string& reason,
                  const std::string& message, Clock::time_point now) {
  if (!status.has_array_field("conditions")) status["conditions"] = Json::array();
  Json& conds = status["conditions"];
  const std::string v = value ? "True" : "False";
  for (size_t i = 0; i < conds.size(); ++i) {
    Json& c = conds[i];
    if (Str(c, {"type"}) != type) continue;
    if (Str(c, {"status"}) != v) c["lastTransitionTime"] = JStr(FormatTime(now));
    c["status"] = JStr(v);
    c["reason"] = JStr(reason);
    c["message"] = JStr(Truncate(message, kMaxConditionMessage));
    return;
  }
  Json c = Json::object();
  c["type"] = JStr(type);
  c["status"] = JStr(v);
  c["reason"] = JStr(reason);
  c["message"] = JStr(Truncate(message, kMaxConditionMessage));
  c["lastTransitionTime"] = JStr(FormatTime(now));
  conds[conds.size()] = c;
}

JobPlan PlanJob(const Json& job, const StatusOr<JobSpec>& spec, const std::vector<ObservedPod>& pods,
                Clock::time_point now, const GangObservation* gang) {
  JobPlan plan;
  const Json* old_status = At(job, {"status"});
  plan.status = old_status && old_status->is_object() ? *old_status : Json::object();
  Json& st = plan.status;
  const std::string old_phase = Str(st, {"phase"});
  std::string phase, reason, message;

  auto finish = [&](const std::string& p, const std::string& r, const std::string& m) {
    phase = p;
    reason = r;
    message = m;
    if (!At(st, {"completionTime"})) st["completionTime"] = JStr(FormatTime(now));
  };
  // Writes phase + conditions and, on a change of phase, the event.
  auto conclude = [&]() {
    st["phase"] = JStr(phase);
    const std::map<std::string, std::string> cond_type = {{kPending, "Created"},    {kRunning, "Running"},
                                                          {kRestarting, "Restarting"}, {kSucceeded, "Succeeded"},
                                                          {kFailed, "Failed"},      {kSuspended, "Suspended"}};
    if (phase != old_phase) {
      SetCondition(st, cond_type.at(phase), true, reason, message, now);
      for (const char* transient : {kRunning, kRestarting, kSuspended}) {
        if (phase != transient && old_phase == transient) {
          SetCondition(st, cond_type.at(transient), false, reason, message, now);
        }
      }
      plan.event_type = (phase == kFailed || phase == kRestarting) ? "Warning" : "Normal";
      plan.event_reason = reason;
      plan.event_message = message;
    }
  };

  if (!spec.ok()) {
    // Never a crash, never a pod: the user fixes the spec (a new object) and applies again.
    finish(kFailed, "InvalidSpec", spec.status().message());
    conclude();
    return plan;
  }
  const JobSpec& js = *spec;
  const std::string name = js.name;

  auto apply_ttl = [&]() {
    if (!js.runPolicy.ttlSecondsAfterFinished) return;
    auto done = ParseTime(Str(st, {"completionTime"}));
    if (!done) return;
    auto expiry = *done + std::chrono::seconds(*js.runPolicy.ttlSecondsAfterFinished);
    if (now >= expiry) {
      plan.delete_job = true;
    } else {
      plan.requeue_after = expiry - now;
    }
  };

  // The status is writable by anyone allowed to write it: clamp, so sums cannot overflow.
  auto count_of = [&](const char* role, const char* field) {
    const int64_t n = Int(st, {"replicaStatuses", role, field}).value_or(0);
    return static_cast<int>(std::clamp<int64_t>(n, 0, 1 << 24));
  };
  // Restarts inside the pods (the progress poller's count) are part of a role's restarts, but
  // not of backoffLimit's: the agent limits those per pod. `restarts`: the pods' replacements.
  std::map<PodRole, int> program = {{PodRole::kScheduler, 0},
                                    {PodRole::kServer, count_of("server", "programRestarts")},
                                    {PodRole::kWorker, count_of("worker", "programRestarts")}};
  auto restarts_of = [&](PodRole role, const char* key) {
    return std::max(0, count_of(key, "restarts") - program[role]);
  };
  std::map<PodRole, int> restarts = {{PodRole::kScheduler, restarts_of(PodRole::kScheduler, "scheduler")},
                                     {PodRole::kServer, restarts_of(PodRole::kServer, "server")},
                                     {PodRole::kWorker, restarts_of(PodRole::kWorker, "worker")}};
  // The first pod failure of the job, kept in status.firstFailure: when a later one ends the job
  // (often a consequence), the job's message still names what went wrong first.
  auto note_failure = [&](const std::string& what) {
    if (!At(st, {"firstFailure"})) st["firstFailure"] = JStr(Truncate(what, 1024));
  };
  auto first_failure_if_other = [&](const std::string& what) {
    const std::string first = Str(st, {"firstFailure"});
    return first.empty() || first == Truncate(what, 1024) ? std::string() : "; the first failure: " + first;
  };

  if (Terminal(old_phase)) {
    phase = old_phase;
    plan.remove = CleanUp(js.runPolicy.cleanPodPolicy, pods);
    WriteCounts(st, Count(pods, {plan.remove.begin(), plan.remove.end()}), restarts, program, js,
                /*keep_finished=*/true);
    FinishProgress(st, phase == kSucceeded, now);
    apply_ttl();
    st["phase"] = JStr(phase);
    return plan;
  }

  if (js.runPolicy.suspend) {
    for (const auto& p : pods) {
      if (!p.deleting) plan.remove.push_back(p.name);
    }
    WriteCounts(st, Count(pods, {plan.remove.begin(), plan.remove.end()}), restarts, program, js,
                /*keep_finished=*/false);
    // The deadline counts running time: a resumed job starts its clock again.
    if (st.has_field("startTime")) st.erase("startTime");
    phase = kSuspended;
    reason = "JobSuspended";
    message = "job " + name + " is suspended: its pods are deleted until spec.runPolicy.suspend is false";
    conclude();
    UpdateWaitCondition(st, plan, kUnschedulable, "", "", reason, message, now);
    return plan;
  }
  if (old_phase == kSuspended) {
    reason = "JobResumed";
    message = "job " + name + " resumed";
  }

  if (!At(st, {"startTime"})) st["startTime"] = JStr(FormatTime(now));
  const auto start = ParseTime(Str(st, {"startTime"})).value_or(now);

  std::map<std::string, const ObservedPod*> by_name;
  for (const auto& p : pods) by_name[p.name] = &p;

  bool restarted = false;
  if (js.runPolicy.activeDeadlineSeconds) {
    const auto deadline = start + std::chrono::seconds(*js.runPolicy.activeDeadlineSeconds);
    if (now >= deadline) {
      finish(kFailed, "DeadlineExceeded",
             "job " + name + " ran longer than activeDeadlineSeconds (" +
                 std::to_string(*js.runPolicy.activeDeadlineSeconds) + "s)");
    } else {
      plan.requeue_after = deadline - now;
    }
  }

  // A server or worker pod deleted from outside (kubectl delete, a drain's eviction) while the
  // job ran: its agent reported the stop and, unless the role's policy is Never, the scheduler
  // keeps the rank for the replacement created below, which rejoins. Under Never the job fails,
  // saying so (before the bystanders' failures that follow from it).
  if (phase.empty() && old_phase == kRunning) {
    for (int role_i = 0; role_i < 2 && phase.empty(); ++role_i) {
      const PodRole role = role_i == 0 ? PodRole::kServer : PodRole::kWorker;
      const RoleSpec& rs = role == PodRole::kServer ? js.servers : js.workers;
      if (js.RestartPolicyFor(rs) != RestartPolicy::kNever) continue;
      for (int i = 0; i < rs.replicas; ++i) {
        auto it = by_name.find(PodName(name, role, i));
        if (it != by_name.end() && !it->second->deleting) continue;
        finish(kFailed, "PodDeleted",
               "job " + name + ": " + RoleName(role) + " " + std::to_string(i) + " (pod " + PodName(name, role, i) +
                   ") was deleted or evicted while the job ran (restartPolicy Never does not replace it)");
        break;
      }
    }
  }

  const std::vector<const ObservedPod*> failed_pods = FailedFirst(pods);
  // A pod's agent found the job already failed at the scheduler (its termination report): no
  // replacement pod could join the job, so where a pod would be recreated the job fails instead,
  // naming the first failure and how it failed (an OOM kill, a missing command), not the exits
  // that followed from it.
  const ObservedPod* told = nullptr;
  for (const ObservedPod* p : failed_pods) {
    if (!p->report.job_failed.empty()) {
      told = p;
      break;
    }
  }
  auto fail_told = [&]() {
    const ObservedPod& first = *failed_pods.front();
    const std::string what = Describe(first) + " " + HowItFailed(first);
    const std::string earlier = first_failure_if_other(what);
    note_failure(what);
    finish(kFailed, FailureReason(first, "PodFailed"),
           "job " + name + ": " + what + earlier + "; the job's scheduler failed the job (" +
               Truncate(told->report.job_failed, 1024) + "), so no pod is recreated: none could join it");
  };

  // Failed pods: restart under the role's policy until backoffLimit, else the job fails.
  int total_restarts =
      restarts[PodRole::kServer] + restarts[PodRole::kWorker] + restarts[PodRole::kScheduler];
  for (const ObservedPod* failed : failed_pods) {
    const ObservedPod& p = *failed;
    if (!phase.empty()) break;
    const std::string what = Describe(p) + " " + HowItFailed(p);
    if (p.role == PodRole::kScheduler) {
      // A new scheduler pod (same Service) recovers the running job from its members
      // (docs/scheduler.md#scheduler-restart); only one that keeps failing fails the job.
      const std::string earlier = first_failure_if_other(what);
      note_failure(what);
      if (total_restarts >= js.runPolicy.backoffLimit) {
        finish(kFailed, "SchedulerFailed",
               "job " + name + ": " + what + " after " + std::to_string(total_restarts) +
                   " restarts (backoffLimit " + std::to_string(js.runPolicy.backoffLimit) + ")" + earlier);
        break;
      }
      if (told) {
        fail_told();
        break;
      }
      ++restarts[p.role];
      ++total_restarts;
      plan.remove.push_back(p.name);
      restarted = true;
      reason = "SchedulerRestarted";
      message = "job " + name + ": " + what +
                "; recreating it, the running job's members hand its state back (restart " +
                std::to_string(total_restarts) + " of at most " +
                std::to_string(js.runPolicy.backoffLimit) + ")";
      plan.events.push_back({"Warning", reason, message});
      continue;
    }
    const RestartPolicy policy = js.RestartPolicyFor(p.role == PodRole::kServer ? js.servers : js.workers);
    if (!p.disruption.empty()) {
      // Evicted, not failed: as Kubernetes Jobs with a DisruptionTarget podFailurePolicy rule,
      // recreated without counting toward backoffLimit; its replacement rejoins the job.
      if (policy == RestartPolicy::kNever) {
        finish(kFailed, "PodDeleted",
               "job " + name + ": " + Describe(p) + " was evicted (" + p.disruption +
                   ") while the job ran (restartPolicy Never does not replace it)");
        break;
      }
      if (told) {
        fail_told();
        break;
      }
      plan.remove.push_back(p.name);
      restarted = true;
      reason = "PodEvicted";
      message = "job " + name + ": " + Describe(p) + " was evicted (" + p.disruption +
                "); recreating it (not counted toward backoffLimit)";
      plan.events.push_back({"Warning", reason, message});
      continue;
    }
    const std::string earlier = first_failure_if_other(what);
    note_failure(what);
    const bool not_found = !p.report.command_not_found.empty();
    const bool permanent = policy == RestartPolicy::kNever ||
                           (policy == RestartPolicy::kExitCode && p.exit_code >= 1 && p.exit_code < kExitSignalBase) ||
                           p.exit_code == kExitConfigurationError ||  // restarting cannot fix it
                           not_found;                                  // nor a missing command
    if (permanent) {
      finish(kFailed, FailureReason(p, "PodFailed"),
             "job " + name + ": " + what +
                 (not_found ? std::string(" (a new pod of the same image cannot find it either)")
                            : " (restartPolicy " + std::string(ToString(policy)) + ")") +
                 earlier);
      break;
    }
    if (total_restarts >= js.runPolicy.backoffLimit) {
      finish(kFailed, "BackoffLimitExceeded",
             "job " + name + ": " + what + " after " + std::to_string(total_restarts) +
                 " restarts (backoffLimit " + std::to_string(js.runPolicy.backoffLimit) + ")" + earlier);
      break;
    }
    if (told) {
      fail_told();
      break;
    }
    ++restarts[p.role];
    ++total_restarts;
    plan.remove.push_back(p.name);
    restarted = true;
    reason = "PodRestarted";
    message = "job " + name + ": " + what + "; recreating it (restart " + std::to_string(total_restarts) +
              " of at most " + std::to_string(js.runPolicy.backoffLimit) + ")";
    plan.events.push_back({"Warning", reason, message});
  }

  if (phase.empty() && Count(pods, {})[PodRole::kWorker].succeeded >= js.workers.replicas) {
    finish(kSucceeded, "JobSucceeded", "job " + name + ": all " + std::to_string(js.workers.replicas) +
                                           " workers succeeded");
  }

  if (Terminal(phase)) {
    // Pods being restarted this very round are dropped: the job is over.
    plan.remove = CleanUp(js.runPolicy.cleanPodPolicy, pods);
    plan.events.clear();
    WriteCounts(st, Count(pods, {plan.remove.begin(), plan.remove.end()}), restarts, program, js,
                /*keep_finished=*/true);
    FinishProgress(st, phase == kSucceeded, now);
    plan.requeue_after.reset();
    apply_ttl();
    conclude();
    return plan;
  }
  // Per-role status (a failed pod being recreated this round still counts as failed).
  WriteCounts(st, Count(pods, {}), restarts, program, js, /*keep_finished=*/false);

  // Create what is missing (a pod still being deleted is recreated once it is gone).
  plan.ensure_support = true;
  std::set<std::string> removing(plan.remove.begin(), plan.remove.end());
  bool all_up = true;
  // The names of DesiredPods, in its order (scheduler, servers, workers).
  std::vector<std::string> order = {PodName(name, PodRole::kScheduler, 0)};
  for (int i = 0; i < js.servers.replicas; ++i) order.push_back(PodName(name, PodRole::kServer, i));
  for (int i = 0; i < js.workers.replicas; ++i) order.push_back(PodName(name, PodRole::kWorker, i));
  const std::set<std::string> wanted(order.begin(), order.end());
  // Pods beyond the replicas (the spec was scaled down) go.
  for (const auto& p : pods) {
    if (!wanted.count(p.name) && !p.deleting && !removing.count(p.name)) {
      plan.remove.push_back(p.name);
      removing.insert(p.name);
    }
  }
  std::string going;  // the first wanted pod being deleted from outside (kubectl delete, a drain)
  for (const auto& pod : order) {
    auto it = by_name.find(pod);
    if (it == by_name.end()) {
      plan.create.push_back(pod);
      all_up = false;
      continue;
    }
    const ObservedPod& p = *it->second;
    const bool up = p.phase == "Running" || (p.role == PodRole::kWorker && p.phase == "Succeeded");
    if (!up || p.deleting || removing.count(pod)) all_up = false;
    if (p.deleting && !removing.count(pod) && going.empty()) going = pod;
  }

  // Why the pods wait, when the cluster says so: the PodGroup could not be made, the gang
  // scheduler holds the gang back, or the scheduler cannot place pods.
  std::string wait_reason, wait_message;
  if (gang && !gang->create_error.empty()) {
    // Pods without their PodGroup would never be scheduled by the gang scheduler.
    plan.create.clear();
    all_up = false;
    wait_reason = "PodGroupNotCreated";
    wait_message = "job " + name + ": " + gang->create_error;
  } else if (!all_up && gang && !gang->unschedulable_reason.empty()) {
    wait_reason = "PodGroupUnschedulable";
    wait_message = "job " + name + ": PodGroup " + PodGroupName(name) + ": " + gang->unschedulable_reason +
                   (gang->unschedulable_message.empty() ? "" : ": " + gang->unschedulable_message);
  } else if (!all_up) {
    const ObservedPod* first = nullptr;
    int n = 0;
    for (const auto& p : pods) {
      if (p.deleting || p.unschedulable.empty()) continue;
      if (!first) first = &p;
      ++n;
    }
    if (first) {
      wait_reason = "PodsUnschedulable";
      wait_message = "job " + name + ": " + std::to_string(n) + " of " + std::to_string(order.size()) +
                     " pods cannot be scheduled; " + Describe(*first) + ": " + first->unschedulable;
    }
  }

  if (restarted) {
    phase = kRestarting;
  } else if (old_phase == kRunning && (!plan.create.empty() || !going.empty())) {
    // A pod of the running job is gone, or seen while its deletion is under way (deleted,
    // evicted, drained): the job is replacing it, not waiting for its first pods; not counted.
    phase = kRestarting;
    reason = "PodRecreated";
    message = !plan.create.empty()
                  ? "job " + name + ": pod " + plan.create.front() +
                        " is gone (deleted or evicted); recreating it (not counted toward "
                        "backoffLimit)"
                  : "job " + name + ": pod " + going +
                        " is being deleted (or evicted); it is recreated once gone (not counted "
                        "toward backoffLimit)";
  } else if (all_up) {
    phase = kRunning;
    if (reason.empty() || old_phase != kRunning) {
      reason = "JobRunning";
      message = "job " + name + ": all pods are running";
    }
  } else if (old_phase == kRestarting) {
    phase = kRestarting;  // until every pod is back up
  } else {
    phase = kPending;
    if (reason.empty()) {
      reason = "JobCreated";
      message = "job " + name + ": creating and waiting for pods";
    }
  }
  // Pods placed whose container cannot start (an image that cannot be pulled, a missing
  // Secret): the job would wait for them for ever; say why.
  std::string start_reason, start_message;
  if (!all_up) {
    const ObservedPod* first = nullptr;
    int n = 0;
    for (const auto& p : pods) {
      if (p.deleting || p.cannot_start.empty()) continue;
      if (!first) first = &p;
      ++n;
    }
    if (first) {
      start_reason = first->cannot_start_reason;
      start_message = "job " + name + ": pod " + first->name + " cannot start: " + first->cannot_start +
                      (n > 1 ? " (and " + std::to_string(n - 1) + " more pods cannot start)" : "");
    }
  }
  conclude();
  UpdateWaitCondition(st, plan, kUnschedulable, wait_reason, wait_message, "PodsScheduled",
                      "job " + name + ": every pod has been scheduled", now);
  UpdateWaitCondition(st, plan, kCannotStart, start_reason, start_message, "ContainersStarted",
                      "job " + name + ": the containers of every pod have started", now);
  return plan;
}

}  // namespace trellis::op
