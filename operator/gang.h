// Gang scheduling (spec.runPolicy.schedulingPolicy): the PodGroup a job owns, what its pods
// carry to join it, and what the PodGroup's status says about the gang. Pure functions; the
// reconciler reads and writes the objects.
//
// Two PodGroup APIs, with their field names as upstream defines them:
//  - Volcano, scheduling.volcano.sh/v1beta1: spec.minMember, spec.queue, spec.priorityClassName;
//    pods join with the annotation scheduling.k8s.io/group-name and schedulerName "volcano";
//    status.conditions[type=Unschedulable] says why the gang waits.
//  - scheduler-plugins coscheduling, scheduling.x-k8s.io/v1alpha1: spec.minMember,
//    spec.scheduleTimeoutSeconds; pods join with the label scheduling.x-k8s.io/pod-group and
//    schedulerName "scheduler-plugins-scheduler" (the name its as-a-second-scheduler install uses).
#pragma once

#include <string>

#include "common/job/job_spec.h"
#include "operator/desired.h"
#include "operator/json_util.h"

namespace trellis::op {

inline constexpr char kVolcanoGroupAnnotation[] = "scheduling.k8s.io/group-name";
inline constexpr char kCoschedulingGroupLabel[] = "scheduling.x-k8s.io/pod-group";

struct PodGroupApi {
  std::string group_version;      // "scheduling.volcano.sh/v1beta1"
  std::string default_scheduler;  // "volcano"
};
PodGroupApi PodGroupApiOf(GangScheduler g);

// Every pod of the job, scheduler included: a Trellis job runs only when all have registered.
int GangSize(const JobSpec& spec);
std::string PodGroupName(const std::string& job);  // the job's name

// The PodGroup of a job whose schedulingPolicy names a gangScheduler (owned by the job).
Json DesiredPodGroup(const JobMeta& job, const JobSpec& spec);

// What every pod of the job gets from its schedulingPolicy: schedulerName (the policy's, else
// the gang scheduler's), priorityClassName, and the PodGroup label or annotation. No-op for a
// job without a schedulingPolicy.
void ApplySchedulingPolicy(const JobMeta& job, const JobSpec& spec, Json& pod);

// What the reconciler learnt about the job's PodGroup, for PlanJob.
struct GangObservation {
  // Set when the PodGroup could not be created (its CRD missing, refused): no pod is created.
  std::string create_error;
  // Set when the gang scheduler says the gang cannot be placed now (Volcano's condition
  // Unschedulable=True): its reason and message.
  std::string unschedulable_reason;
  std::string unschedulable_message;
};
// Reads a PodGroup object as the API server returned it.
GangObservation ObservePodGroup(const Json& pod_group);

}  // namespace trellis::op
