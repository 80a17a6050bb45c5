#include "operator/target_discovery.h"

#include "operator/desired.h"

namespace trellis::op {
namespace {

// One http_sd target group: {"targets": [target], "labels": labels}.
Json Group(const std::string& target, Json labels) {
  Json targets = Json::array();
  targets[0] = JStr(target);
  Json group = Json::object();
  group["targets"] = targets;
  group["labels"] = std::move(labels);
  return group;
}

}  // namespace

std::vector<Json> PodTargetGroups(const Json& pod) {
  std::vector<Json> out;
  const std::string job = Str(pod, {"metadata", "labels", kLabelJob});
  const std::string ip = Str(pod, {"status", "podIP"});
  const std::string phase = Str(pod, {"status", "phase"});
  if (job.empty() || ip.empty() || phase == "Succeeded" || phase == "Failed") return out;
  const std::string role = Str(pod, {"metadata", "labels", kLabelRole});
  const std::string rank = Str(pod, {"metadata", "labels", kLabelRank});
  const std::string process = rank.empty() ? role : role + "-" + rank;
  const Json* containers = At(pod, {"spec", "containers"});
  if (!containers || !containers->is_array()) return out;
  for (size_t c = 0; c < containers->size(); ++c) {
    const Json* ports = At(containers->at(c), {"ports"});
    if (!ports || !ports->is_array()) continue;
    for (size_t p = 0; p < ports->size(); ++p) {
      const std::string name = Str(ports->at(p), {"name"});
      const auto number = Int(ports->at(p), {"containerPort"});
      if ((name != "metrics" && name != "agent-metrics") || !number || *number <= 0 || *number > 65535) continue;
      Json labels = Json::object();
      labels["namespace"] = JStr(Str(pod, {"metadata", "namespace"}));
      labels["pod"] = JStr(Str(pod, {"metadata", "name"}));
      labels["job"] = JStr(job);
      if (!role.empty()) labels["role"] = JStr(role);
      if (!rank.empty()) labels["rank"] = JStr(rank);
      labels["trellis_process"] = JStr(name == "agent-metrics" ? process + "-agent" : process);
      // IPv6 pod addresses need brackets before the port.
      const std::string host = ip.find(':') != std::string::npos ? "[" + ip + "]" : ip;
      out.push_back(Group(host + ":" + std::to_string(*number), std::move(labels)));
    }
  }
  return out;
}

std::string TargetsJson(const std::vector<Json>& pods, const std::string& self) {
  Json all = Json::array();
  size_t n = 0;
  for (const Json& pod : pods) {
    for (Json& g : PodTargetGroups(pod)) all[n++] = std::move(g);
  }
  if (!self.empty()) {
    Json labels = Json::object();
    labels["role"] = JStr("operator");
    labels["trellis_process"] = JStr("operator");
    all[n++] = Group(self, std::move(labels));
  }
  return all.serialize();
}

}  // namespace trellis::op
