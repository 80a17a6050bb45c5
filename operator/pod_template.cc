#include "operator/pod_template.h"

#include <cmath>
#include <exception>
#include <set>

#include <yaml-cpp/yaml.h>

namespace trellis::op {
namespace {

Json Scalar(const YAML::Node& n) {
  const std::string s = n.Scalar();
  if (n.Tag() != "?") return JStr(s);  // quoted or explicitly tagged: as written
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return Json::null();
  if (s == "true" || s == "True" || s == "TRUE") return Json::boolean(true);
  if (s == "false" || s == "False" || s == "FALSE") return Json::boolean(false);
  try {
    size_t used = 0;
    long long i = std::stoll(s, &used, 10);
    if (used == s.size()) return Json::number(static_cast<int64_t>(i));
    double d = std::stod(s, &used);
    if (used == s.size() && std::isfinite(d)) return Json::number(d);
  } catch (const std::exception&) {
  }
  return JStr(s);
}

Json Convert(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (const auto& kv : n) o[kv.first.as<std::string>()] = Convert(kv.second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      size_t i = 0;
      for (const auto& item : n) a[i++] = Convert(item);
      return a;
    }
    case YAML::NodeType::Scalar: return Scalar(n);
    default: return Json::null();
  }
}

// Items of `extra` whose "name" is not among `ours`' names, appended to ours.
Json AppendByName(const Json* ours, const Json* extra) {
  Json out = ours && ours->is_array() ? *ours : Json::array();
  if (!extra || !extra->is_array()) return out;
  std::set<std::string> names;
  for (size_t i = 0; i < out.size(); ++i) names.insert(Str(out[i], {"name"}));
  for (size_t i = 0; i < extra->size(); ++i) {
    const Json& item = extra->at(i);
    if (names.insert(Str(item, {"name"})).second) out[out.size()] = item;
  }
  return out;
}

}  // namespace

StatusOr<Json> YamlToJson(const std::string& yaml_text) {
  try {
    return Convert(YAML::Load(yaml_text));
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("pod template: ") + e.what());
  }
}

Json MergeUnder(const Json& base, const Json& over) {
  if (!base.is_object() || !over.is_object()) return over;
  Json out = base;
  for (const auto& [k, v] : over.as_object()) {
    const Json* b = At(out, {k.c_str()});
    out[k] = b ? MergeUnder(*b, v) : v;
  }
  return out;
}

StatusOr<Json> ApplyPodTemplate(const Json& pod, const std::string& template_yaml) {
  if (template_yaml.empty()) return pod;
  TRELLIS_ASSIGN_OR_RETURN(Json tmpl, YamlToJson(template_yaml));
  if (tmpl.is_null()) return pod;
  if (!tmpl.is_object()) return InvalidArgumentError("pod template: must be a mapping");

  // Every read below is of user data: At/Str only (cpprestsdk's at() and erase() throw on a
  // missing key, e.g. a template with only spec.nodeSelector).
  const Json* tspec_in = At(tmpl, {"spec"});
  Json tspec = tspec_in && tspec_in->is_object() ? *tspec_in : Json::object();
  const Json* tc_in = At(tspec, {"containers"});
  const Json tcontainers = tc_in && tc_in->is_array() ? *tc_in : Json::array();
  const Json* tv_in = At(tspec, {"volumes"});
  const Json tvolumes = tv_in && tv_in->is_array() ? *tv_in : Json::array();
  for (const char* k : {"containers", "volumes"}) {
    if (tspec.has_field(k)) tspec.erase(k);
  }

  Json out = pod;
  if (const Json* tmeta = At(tmpl, {"metadata"}); tmeta && tmeta->is_object()) {
    for (const char* k : {"labels", "annotations"}) {
      if (const Json* extra = At(*tmeta, {k}); extra && extra->is_object()) {
        const Json* ours = At(out, {"metadata", k});
        Put(out, {"metadata", k}, MergeUnder(*extra, ours ? *ours : Json::object()));
      }
    }
  }
  const Json* our_spec = At(out, {"spec"});
  const Json* our_containers = our_spec ? At(*our_spec, {"containers"}) : nullptr;
  if (!our_containers || !our_containers->is_array() || our_containers->size() == 0) {
    return InvalidArgumentError("pod template: the pod has no container to merge into");
  }
  Json spec = MergeUnder(tspec, *our_spec);

  // The operator's container over the template's "trellis" (or first unnamed) container.
  Json containers = *our_containers;
  Json& mine = containers[0];
  Json sidecars = Json::array();
  bool merged = false;
  for (size_t i = 0; i < tcontainers.size(); ++i) {
    const Json& tc = tcontainers.at(i);
    const std::string name = Str(tc, {"name"});
    if (!merged && (name == Str(mine, {"name"}) || name.empty())) {
      Json combined = MergeUnder(tc, mine);
      for (const char* list : {"env", "volumeMounts", "ports"}) {
        Json l = AppendByName(At(mine, {list}), At(tc, {list}));
        if (l.size() > 0) combined[list] = l;
      }
      combined["name"] = JStr(Str(mine, {"name"}));
      mine = combined;
      merged = true;
    } else {
      sidecars[sidecars.size()] = tc;
    }
  }
  for (size_t i = 0; i < sidecars.size(); ++i) containers[containers.size()] = sidecars[i];
  spec["containers"] = containers;
  spec["volumes"] = AppendByName(At(spec, {"volumes"}), &tvolumes);
  out["spec"] = spec;
  return out;
}

}  // namespace trellis::op
