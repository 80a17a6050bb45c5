#include "operator/observed_pod.h"

#include <algorithm>

namespace trellis::op {
namespace {

// The kubelet's reasons for a container that waits and will not start by itself.
bool CannotStartReason(const std::string& r) {
  static const char* const kReasons[] = {"ErrImagePull",          "ImagePullBackOff",     "InvalidImageName",
                                         "ErrImageNeverPull",     "RegistryUnavailable",  "SignatureValidationFailed",
                                         "CreateContainerConfigError", "CreateContainerError", "RunContainerError"};
  return std::find(std::begin(kReasons), std::end(kReasons), r) != std::end(kReasons);
}

bool ReportEmpty(const TerminationReport& r) {
  return r.error.empty() && r.command_not_found.empty() && r.exit.empty() && r.restarts == 0 &&
         r.job_failed.empty() && r.program_error.empty() && r.lost.empty() && r.taken_over.empty();
}

}  // namespace

std::string FailureReason(const ObservedPod& p, const std::string& fallback) {
  if (p.terminated_reason == "OOMKilled") return "OOMKilled";
  if (!p.report.command_not_found.empty()) return "CommandNotFound";
  return fallback;
}

std::string Describe(const ObservedPod& p) {
  std::string s = RoleName(p.role);
  if (p.role != PodRole::kScheduler) s += " " + std::to_string(p.index);
  s += " (pod " + p.name + ")";
  return s;
}

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
  o.uid = Str(pod, {"metadata", "uid"});
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

}  // namespace trellis::op
