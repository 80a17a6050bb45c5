#include "operator/server_takeover.h"

#include "operator/job_status.h"
#include "operator/json_util.h"
#include "operator/plan_phases.h"

namespace trellis::op {

bool TakenOverServer(const JobSpec& spec, const ObservedPod& p) {
  return spec.elastic.enabled && p.role == PodRole::kServer && p.phase == "Failed" && !p.report.taken_over.empty();
}

void NoteTakenOverServers(PlanRound& r) {
  if (!r.phase.empty() || !r.spec.elastic.enabled) return;
  for (const ObservedPod& p : r.pods) {
    if (!TakenOverServer(r.spec, p) || p.deleting) continue;
    const Json* listed = At(r.plan.status, {"world", "takenOver"});
    Json list = listed && listed->is_array() ? *listed : Json::array();
    bool noted = false;
    for (const Json& e : list.as_array()) noted = noted || Str(e, {"pod"}) == p.name;
    if (noted) continue;
    Json entry = Json::object();
    entry["server"] = Json::number(p.index);
    entry["pod"] = JStr(p.name);
    entry["reason"] = JStr(p.report.taken_over.substr(0, 1024));
    entry["time"] = JStr(FormatTime(r.now));
    list[list.size()] = entry;
    r.plan.status["world"]["takenOver"] = list;
    r.plan.events.push_back({"Warning", "ServerTakenOver", "job " + r.name + ": " + p.report.taken_over.substr(0, 1024)});
  }
}

}  // namespace trellis::op
