#include "operator/gang.h"

namespace trellis::op {

PodGroupApi PodGroupApiOf(GangScheduler g) {
  switch (g) {
    case GangScheduler::kVolcano: return {"scheduling.volcano.sh/v1beta1", "volcano"};
    case GangScheduler::kSchedulerPlugins: return {"scheduling.x-k8s.io/v1alpha1", "scheduler-plugins-scheduler"};
  }
  return {};
}

int GangSize(const JobSpec& spec) { return static_cast<int>(DesiredPodList(spec.name, spec).size()); }

std::string PodGroupName(const std::string& job) { return job; }

Json DesiredPodGroup(const JobMeta& job, const JobSpec& spec) {
  const SchedulingPolicySpec& p = spec.runPolicy.schedulingPolicy;
  const GangScheduler g = p.gangScheduler.value_or(GangScheduler::kVolcano);
  Json pg = Json::object();
  pg["apiVersion"] = JStr(PodGroupApiOf(g).group_version);
  pg["kind"] = JStr("PodGroup");
  Json meta = Json::object();
  meta["name"] = JStr(PodGroupName(job.name));
  meta["namespace"] = JStr(job.ns);
  Put(meta, {"labels", kLabelJob}, JStr(job.name));
  Json owners = Json::array();
  owners[0] = OwnerReference(job);
  meta["ownerReferences"] = owners;
  pg["metadata"] = meta;
  Json s = Json::object();
  s["minMember"] = Json::number(GangSize(spec));
  if (g == GangScheduler::kVolcano) {
    if (!p.queue.empty()) s["queue"] = JStr(p.queue);
    if (!p.priorityClass.empty()) s["priorityClassName"] = JStr(p.priorityClass);
  } else if (p.scheduleTimeoutSeconds) {
    s["scheduleTimeoutSeconds"] = Json::number(*p.scheduleTimeoutSeconds);
  }
  pg["spec"] = s;
  return pg;
}

void ApplySchedulingPolicy(const JobMeta& job, const JobSpec& spec, Json& pod) {
  const SchedulingPolicySpec& p = spec.runPolicy.schedulingPolicy;
  std::string scheduler = p.schedulerName;
  if (scheduler.empty() && p.gangScheduler) scheduler = PodGroupApiOf(*p.gangScheduler).default_scheduler;
  if (!scheduler.empty()) Put(pod, {"spec", "schedulerName"}, JStr(scheduler));
  if (!p.priorityClass.empty()) Put(pod, {"spec", "priorityClassName"}, JStr(p.priorityClass));
  if (p.gangScheduler == GangScheduler::kVolcano) {
    Put(pod, {"metadata", "annotations", kVolcanoGroupAnnotation}, JStr(PodGroupName(job.name)));
  } else if (p.gangScheduler == GangScheduler::kSchedulerPlugins) {
    Put(pod, {"metadata", "labels", kCoschedulingGroupLabel}, JStr(PodGroupName(job.name)));
  }
}

GangObservation ObservePodGroup(const Json& pod_group) {
  GangObservation o;
  const Json* conds = At(pod_group, {"status", "conditions"});
  if (!conds || !conds->is_array()) return o;
  for (size_t i = 0; i < conds->size(); ++i) {
    const Json& c = conds->at(i);
    if (Str(c, {"type"}) != "Unschedulable" || Str(c, {"status"}) != "True") continue;
    o.unschedulable_reason = Str(c, {"reason"}, "Unschedulable");
    o.unschedulable_message = Str(c, {"message"});
  }
  return o;
}

}  // namespace trellis::op
