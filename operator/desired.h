// The objects a TrainingJob should own, as pure functions of the job (no server involved):
// a token Secret, a ConfigMap with the job file for the scheduler, the scheduler Pod and its
// Service, server Pods and worker Pods. Every object carries a controller ownerReference to the
// job (so deleting the job deletes them) and the labels trellis.io/job-name, trellis.io/role,
// trellis.io/rank. The PodGroup of a gang-scheduled job is in operator/gang.h.
#pragma once

#include <string>
#include <vector>

#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "operator/json_util.h"

namespace trellis::op {

inline constexpr char kGroupVersion[] = "trellis.io/v1alpha1";
inline constexpr char kLabelJob[] = "trellis.io/job-name";
inline constexpr char kLabelRole[] = "trellis.io/role";
inline constexpr char kLabelRank[] = "trellis.io/rank";
inline constexpr char kGpuResource[] = "nvidia.com/gpu";
// Labels of the job under this prefix (kueue.x-k8s.io/queue-name, ...) are not copied to pods.
inline constexpr char kKueueLabelPrefix[] = "kueue.x-k8s.io/";

struct OperatorSettings {
  std::string default_image = "ghcr.io/trellis-ml/trellis:0.1.0";  // when spec.image is empty
  int scheduler_port = 7000;
  int metrics_port = 9100;                       // the prometheus.io/port annotation; the agent's: +1
  std::string token_dir = "/var/run/trellis";    // token Secret mount; file "token"
  std::string config_dir = "/etc/trellis";       // job ConfigMap mount; file "job.yaml"
};

enum class PodRole { kScheduler, kServer, kWorker };
std::string RoleName(PodRole r);  // "scheduler", "server", "worker"

// The identity of a job object, as its ownerReference needs it.
struct JobMeta {
  std::string name;
  std::string ns;
  std::string uid;
};
// Reads metadata.name/namespace/uid; an error when the name is missing.
StatusOr<JobMeta> JobMetaOf(const Json& job);

std::string PodName(const std::string& job, PodRole role, int index);  // "<job>-worker-3", "<job>-scheduler"
std::string TokenSecretName(const std::string& job);                    // "<job>-token"
std::string ConfigMapName(const std::string& job);                      // "<job>-config"
std::string ServiceName(const std::string& job);                        // "<job>-scheduler"
// The label selector (URL form) of every pod of a job: "trellis.io/job-name=<job>".
std::string JobSelector(const std::string& job);

Json OwnerReference(const JobMeta& job);

Json TokenSecret(const JobMeta& job, const std::string& token);
Json JobConfigMap(const JobMeta& job, const JobSpec& spec);
Json SchedulerService(const JobMeta& job, const OperatorSettings& s);
Json SchedulerPod(const JobMeta& job, const JobSpec& spec, const OperatorSettings& s);
// A server (kServer) or worker (kWorker) pod: the agent as entrypoint with the role's restart
// policy and the job's backoffLimit, the environment of DESIGN.md, resources and GPUs, and the
// role's pod template merged in (operator/pod_template.h).
Json RolePod(const JobMeta& job, const JobSpec& spec, PodRole role, int index, const OperatorSettings& s);

// What every pod of a job gets unless the role's pod template sets its own (the template's
// value wins, whole): no service-account token (spec.automountServiceAccountToken false: no
// Trellis process talks to the API server), the runtime's default seccomp profile and, when the
// pod runs the operator's own image (its user is 1000, not root), runAsNonRoot (pod
// securityContext); no privilege escalation and no capabilities (the "trellis" container's
// securityContext).
void ApplyPodSecurityDefaults(Json& pod, bool non_root_image);

// spec.checkpoint.volume (docs/checkpoints.md#on-kubernetes): mounted as kCheckpointVolume at
// spec.checkpoint.path in every worker pod and, in update mode, every server pod.
inline constexpr char kCheckpointVolume[] = "checkpoints";
bool NeedsCheckpointVolume(const JobSpec& spec, PodRole role);
// The job's checkpoints outlive its pods: no checkpoints, spec.checkpoint.volume, or a volume the
// workers' template mounts at (or above) spec.checkpoint.path. False: they die with the pods.
bool CheckpointsOnAVolume(const JobSpec& spec);

// One pod the job should have, by its identity; BuildPod makes its object. The plan (PlanJob)
// and the pod creation (the reconciler) read the same list, DesiredPodList.
struct DesiredPod {
  std::string name;  // PodName(job, role, index)
  PodRole role = PodRole::kWorker;
  int index = 0;  // the rank (trellis.io/rank); 0 for the scheduler, which has none
  bool operator==(const DesiredPod&) const = default;
};
// Every pod the job should have: the scheduler, then the servers, then the workers, by rank.
std::vector<DesiredPod> DesiredPodList(const std::string& job, const JobSpec& spec);
// The same with the workers of `worker_slots` (ascending ranks): an elastic job's world, which a
// worker lost for good leaves with a gap.
std::vector<DesiredPod> DesiredPodList(const std::string& job, const JobSpec& spec,
                                       const std::vector<int>& worker_slots);
// The object of `pod`: SchedulerPod or RolePod.
Json BuildPod(const JobMeta& job, const JobSpec& spec, const DesiredPod& pod, const OperatorSettings& s);
// BuildPod of every pod of DesiredPodList, in its order.
std::vector<Json> DesiredPods(const JobMeta& job, const JobSpec& spec, const OperatorSettings& s);

}  // namespace trellis::op
