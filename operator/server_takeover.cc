#include "operator/server_takeover.h"

#include "operator/job_status.h"
#include "operator/plan_phases.h"

namespace trellis::op {

bool ServersElastic(const JobSpec& spec) {
  return spec.elastic.enabled && spec.elastic.minServers < spec.elastic.maxServers;
}

bool TakenOverServer(const JobSpec& spec, const ObservedPod& p) {
  return ServersElastic(spec) && p.role == PodRole::kServer && p.phase == "Failed" && !p.report.taken_over.empty();
}

namespace {

bool Noted(const Json& st, int rank) {
  const Json* listed = At(st, {"world", "takenOver"});
  if (!listed || !listed->is_array()) return false;
  for (const Json& e : listed->as_array()) {
    if (Int(e, {"server"}) == rank) return true;
  }
  return false;
}

// The world's servers (ranks 0..n-1).
int64_t WorldServers(const PlanRound& r) {
  return Int(r.plan.status, {"world", "servers"}).value_or(r.spec.servers.replicas);
}

}  // namespace

bool ServerTakenOver(const PlanRound& r, const DesiredPod& d) {
  if (d.role != PodRole::kServer || !ServersElastic(r.spec)) return false;
  // Only a rank of the world's servers: one a grow adds, or a shrink removes, is not lost.
  if (d.index >= WorldServers(r)) return false;
  if (Noted(r.plan.status, d.index)) return true;
  auto it = r.observed.find(d.name);
  if (it != r.observed.end() && TakenOverServer(r.spec, *it->second)) return true;
  if (r.spec.RestartPolicyFor(r.spec.servers) != RestartPolicy::kNever) return false;
  if (r.old_phase != kRunning && r.old_phase != kRestarting) return false;  // not made yet, rather
  if (it == r.observed.end()) return true;
  const ObservedPod& p = *it->second;
  return p.deleting || (p.phase == "Failed" && !p.disruption.empty());  // evicted: Failed, kept
}

std::string NoteTakeOver(Json& st, const std::string& job, int rank, const std::string& pod, const std::string& why,
                         Clock::time_point now) {
  if (Noted(st, rank)) return "";
  const Json* listed = At(st, {"world", "takenOver"});
  Json list = listed && listed->is_array() ? *listed : Json::array();
  Json entry = Json::object();
  entry["server"] = Json::number(rank);
  entry["pod"] = JStr(pod);
  entry["reason"] = JStr(why.substr(0, 1024));
  entry["time"] = JStr(FormatTime(now));
  list[list.size()] = entry;
  st["world"]["takenOver"] = list;
  return "job " + job + ": " + why.substr(0, 1024);
}

void NoteTakenOverServers(PlanRound& r) {
  if (!r.phase.empty() || !ServersElastic(r.spec)) return;
  // A shrink removed ranks taken over: a later grow makes their pods again, as themselves.
  if (const Json* listed = At(r.plan.status, {"world", "takenOver"}); listed && listed->is_array()) {
    Json kept = Json::array();
    for (const Json& e : listed->as_array()) {
      if (Int(e, {"server"}).value_or(0) < WorldServers(r)) kept[kept.size()] = e;
    }
    if (kept.size() != listed->size()) r.plan.status["world"]["takenOver"] = kept;
  }
  for (const ObservedPod& p : r.pods) {
    if (!TakenOverServer(r.spec, p) || p.deleting || p.index >= WorldServers(r)) continue;
    const std::string m = NoteTakeOver(r.plan.status, r.name, p.index, p.name, p.report.taken_over, r.now);
    if (!m.empty()) r.plan.events.push_back({"Warning", "ServerTakenOver", m});
  }
}

}  // namespace trellis::op
