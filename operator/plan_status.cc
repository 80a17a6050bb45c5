#include "operator/plan_status.h"

#include <algorithm>

namespace trellis::op {
namespace {

Json CountsJson(const RoleCounts& c, int restarts) {
  Json j = Json::object();
  j["active"] = Json::number(c.active);
  j["running"] = Json::number(c.running);
  j["succeeded"] = Json::number(c.succeeded);
  j["failed"] = Json::number(c.failed);
  j["restarts"] = Json::number(restarts);
  return j;
}

// A count of status.replicaStatuses.<role>, clamped.
int CountIn(const Json& status, const char* role, const char* field) {
  const int64_t n = Int(status, {"replicaStatuses", role, field}).value_or(0);
  return static_cast<int>(std::clamp<int64_t>(n, 0, 1 << 24));
}

bool Active(const ObservedPod& p) { return p.phase == "Pending" || p.phase == "Running" || p.phase == "Unknown"; }

}  // namespace

std::map<PodRole, RoleCounts> CountPods(const std::vector<ObservedPod>& pods, const std::set<std::string>& removing) {
  std::map<PodRole, RoleCounts> counts;
  for (const auto& p : pods) {
    RoleCounts& c = counts[p.role];
    const bool going = p.deleting || removing.count(p.name) > 0;
    if (p.phase == "Running" && !going) ++c.running;
    if (Active(p) && !going) ++c.active;
    if (p.phase == "Succeeded") ++c.succeeded;
    if (p.phase == "Failed") ++c.failed;
  }
  return counts;
}

int RestartCounts::PodTotal() const {
  int total = 0;
  for (const auto& role_count : pods) total += role_count.second;
  return total;
}

RestartCounts ReadRestarts(const Json& status) {
  RestartCounts r;
  r.program[PodRole::kServer] = CountIn(status, "server", "programRestarts");
  r.program[PodRole::kWorker] = CountIn(status, "worker", "programRestarts");
  r.pods[PodRole::kScheduler] = std::max(0, CountIn(status, "scheduler", "restarts") - r.program[PodRole::kScheduler]);
  r.pods[PodRole::kServer] = std::max(0, CountIn(status, "server", "restarts") - r.program[PodRole::kServer]);
  r.pods[PodRole::kWorker] = std::max(0, CountIn(status, "worker", "restarts") - r.program[PodRole::kWorker]);
  r.job = static_cast<int>(std::clamp<int64_t>(Int(status, {"jobRestarts"}).value_or(0), 0, 1 << 24));
  return r;
}

void WriteCounts(Json& st, const std::map<PodRole, RoleCounts>& counts_in, const RestartCounts& restarts,
                 const JobSpec& js, bool keep_finished) {
  std::map<PodRole, RoleCounts> counts = counts_in;
  const std::pair<PodRole, const char*> roles[] = {
      {PodRole::kScheduler, "scheduler"}, {PodRole::kServer, "server"}, {PodRole::kWorker, "worker"}};
  Json rs = Json::object();
  int total_restarts = 0;
  for (const auto& role_key : roles) {
    const PodRole role = role_key.first;
    const char* const key = role_key.second;  // not a structured binding: clang 14 cannot capture one
    RoleCounts& c = counts[role];
    if (keep_finished) {
      c.succeeded = std::max(c.succeeded, CountIn(st, key, "succeeded"));
      c.failed = std::max(c.failed, CountIn(st, key, "failed"));
    }
    const int in_pods = restarts.program.count(role) ? restarts.program.at(role) : 0;
    const int r = (restarts.pods.count(role) ? restarts.pods.at(role) : 0) + in_pods;
    total_restarts += r;
    rs[key] = CountsJson(c, r);
    if (in_pods > 0) rs[key]["programRestarts"] = Json::number(in_pods);
  }
  st["replicaStatuses"] = rs;
  if (restarts.job > 0) st["jobRestarts"] = Json::number(restarts.job);
  st["restarts"] = Json::number(total_restarts + restarts.job);
  st["workers"] = JStr(std::to_string(counts[PodRole::kWorker].running + counts[PodRole::kWorker].succeeded) +
                       "/" + std::to_string(js.workers.replicas));
  st["servers"] = JStr(std::to_string(counts[PodRole::kServer].running) + "/" +
                       std::to_string(js.servers.replicas));
}

std::vector<std::string> CleanUp(CleanPodPolicy policy, const std::vector<ObservedPod>& pods) {
  std::vector<std::string> out;
  for (const auto& p : pods) {
    if (p.deleting) continue;
    if (policy == CleanPodPolicy::kAll || (policy == CleanPodPolicy::kRunning && Active(p))) out.push_back(p.name);
  }
  return out;
}

void ConcludePhase(JobPlan& plan, const std::string& old_phase, const std::string& phase, const std::string& reason,
                   const std::string& message, Clock::time_point now) {
  Json& st = plan.status;
  st["phase"] = JStr(phase);
  if (phase == old_phase) return;
  const std::map<std::string, std::string> cond_type = {{kPending, "Created"},      {kRunning, "Running"},
                                                        {kRestarting, "Restarting"}, {kSucceeded, "Succeeded"},
                                                        {kFailed, "Failed"},        {kSuspended, "Suspended"}};
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

void UpdateWaitCondition(JobPlan& plan, const char* type, const Wait& wait, const Wait& cleared,
                         Clock::time_point now) {
  Json& st = plan.status;
  bool was_true = false;
  if (const Json* conds = At(st, {"conditions"}); conds && conds->is_array()) {
    for (size_t i = 0; i < conds->size(); ++i) {
      if (Str(conds->at(i), {"type"}) != type) continue;
      was_true = Str(conds->at(i), {"status"}) == "True";
    }
  }
  if (wait.reason.empty()) {
    if (was_true) SetCondition(st, type, false, cleared.reason, cleared.message, now);
    return;
  }
  // Schedulers' messages list every node's reason; the status keeps a readable head.
  constexpr size_t kMaxMessage = 1024;
  std::string message = wait.message;
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage - 3) + "...";
  SetCondition(st, type, true, wait.reason, message, now);
  if (was_true) return;
  if (plan.event_type != "Warning") {
    plan.event_type = "Warning";
    plan.event_reason = wait.reason;
    plan.event_message = message;
  } else {
    plan.events.push_back({"Warning", wait.reason, message});
  }
}

bool ConditionTrue(const Json& status, const std::string& type) {
  const Json* conds = At(status, {"conditions"});
  for (size_t i = 0; conds && conds->is_array() && i < conds->size(); ++i) {
    const Json& c = conds->at(i);
    if (Str(c, {"type"}) == type) return Str(c, {"status"}) == "True";
  }
  return false;
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

}  // namespace trellis::op
