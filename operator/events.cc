#include "operator/events.h"

#include <functional>

#include "operator/desired.h"

namespace trellis::op {

Status RecordJobEvent(KubeClient& client, const Json& job, const std::string& type, const std::string& reason,
                      const std::string& message, Clock::time_point now_time) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  const std::string now = FormatTime(now_time);
  Json ev = Json::object();
  ev["apiVersion"] = JStr("v1");
  ev["kind"] = JStr("Event");
  // Unique per transition: the job's resourceVersion names the state that caused it.
  // (A job name may be up to 253 characters when its spec is invalid; an event name too.)
  Put(ev, {"metadata", "name"}, JStr(name.substr(0, 200) + "." + Str(job, {"metadata", "resourceVersion"}) + "." +
                                      std::to_string(std::hash<std::string>{}(reason + message) % 100000)));
  Put(ev, {"metadata", "namespace"}, JStr(ns));
  Json ref = Json::object();
  ref["apiVersion"] = JStr(kGroupVersion);
  ref["kind"] = JStr("TrainingJob");
  ref["name"] = JStr(name);
  ref["namespace"] = JStr(ns);
  ref["uid"] = JStr(Str(job, {"metadata", "uid"}));
  ev["involvedObject"] = ref;
  ev["type"] = JStr(type);
  ev["reason"] = JStr(reason);
  ev["message"] = JStr(Truncate(message, 1024));
  ev["firstTimestamp"] = JStr(now);
  ev["lastTimestamp"] = JStr(now);
  ev["count"] = Json::number(1);
  Put(ev, {"source", "component"}, JStr("trellis-operator"));
  auto s = client.Create(kEvents, ns, ev);
  if (s.ok() || s.status().code() == StatusCode::kAlreadyExists) return Status::Ok();
  return s.status();
}

}  // namespace trellis::op
