#include "operator/desired.h"

#include <algorithm>
#include <numeric>

#include "common/config/env_names.h"
#include "common/config/env.h"
#include "common/tls/tls.h"
#include "operator/gang.h"
#include "operator/pod_template.h"

namespace trellis::op {
namespace {

Json Metadata(const JobMeta& job, const std::string& name, const std::string& role, int rank,
              const JobSpec* spec) {
  Json m = Json::object();
  m["name"] = JStr(name);
  m["namespace"] = JStr(job.ns);
  Json labels = Json::object();
  if (spec) {
    for (const auto& [k, v] : spec->labels) {
      // Kueue admits the job as a whole (through suspend); its labels on the pods would make
      // Kueue's pod integration queue each pod again on its own.
      if (k.rfind(kKueueLabelPrefix, 0) == 0) continue;
      labels[k] = JStr(v);
    }
  }
  labels[kLabelJob] = JStr(job.name);
  if (!role.empty()) labels[kLabelRole] = JStr(role);
  if (rank >= 0) labels[kLabelRank] = JStr(std::to_string(rank));
  m["labels"] = labels;
  Json owners = Json::array();
  owners[0] = OwnerReference(job);
  m["ownerReferences"] = owners;
  return m;
}

Json EnvVar(const std::string& name, const std::string& value) {
  Json e = Json::object();
  e["name"] = JStr(name);
  e["value"] = JStr(value);
  return e;
}

Json FieldEnv(const std::string& name, const std::string& field_path) {
  Json e = Json::object();
  e["name"] = JStr(name);
  Put(e, {"valueFrom", "fieldRef", "fieldPath"}, JStr(field_path));
  return e;
}

Json Strings(const std::vector<std::string>& v) {
  Json a = Json::array();
  for (size_t i = 0; i < v.size(); ++i) a[i] = JStr(v[i]);
  return a;
}

Json Resources(const ResourceSpec& req, const ResourceSpec& lim, int gpus) {
  Json r = Json::object();
  auto fill = [](Json& out, const ResourceSpec& rs) {
    if (!rs.cpu.empty()) out["cpu"] = JStr(rs.cpu);
    if (!rs.memory.empty()) out["memory"] = JStr(rs.memory);
  };
  Json requests = Json::object(), limits = Json::object();
  fill(requests, req);
  fill(limits, lim);
  // Extended resources must have request == limit; setting the limit alone implies it.
  if (gpus > 0) limits[kGpuResource] = JStr(std::to_string(gpus));
  if (requests.size() > 0) r["requests"] = requests;
  if (limits.size() > 0) r["limits"] = limits;
  return r;
}

Json Volume(const std::string& name, const char* kind, const char* key, const std::string& ref) {
  Json v = Json::object();
  v["name"] = JStr(name);
  Put(v, {kind, key}, JStr(ref));
  return v;
}

Json Mount(const std::string& name, const std::string& path) {
  Json m = Json::object();
  m["name"] = JStr(name);
  m["mountPath"] = JStr(path);
  m["readOnly"] = Json::boolean(true);
  return m;
}

Json PodShell(const JobMeta& job, const JobSpec& spec, PodRole role, int index, const OperatorSettings& s,
              Json container, bool with_config) {
  Json pod = Json::object();
  pod["apiVersion"] = JStr("v1");
  pod["kind"] = JStr("Pod");
  const std::string name = PodName(job.name, role, index);
  Json meta = Metadata(job, name, RoleName(role), role == PodRole::kScheduler ? -1 : index, &spec);
  Json ann = Json::object();
  ann["prometheus.io/scrape"] = JStr("true");
  ann["prometheus.io/port"] = JStr(std::to_string(s.metrics_port));
  ann["prometheus.io/path"] = JStr("/metrics");
  meta["annotations"] = ann;
  pod["metadata"] = meta;

  Json mounts = Json::array();
  Json volumes = Json::array();
  mounts[0] = Mount("token", s.token_dir);
  volumes[0] = Volume("token", "secret", "secretName", TokenSecretName(job.name));
  if (with_config) {
    mounts[1] = Mount("job", s.config_dir);
    volumes[1] = Volume("job", "configMap", "name", ConfigMapName(job.name));
  }
  if (!spec.tls.secretName.empty()) {
    // The job's certificates (ca.crt, tls.crt, tls.key), where spec.tls's paths default to.
    const size_t n = mounts.size();
    mounts[n] = Mount("tls", std::string(kTlsMountDir));
    volumes[n] = Volume("tls", "secret", "secretName", spec.tls.secretName);
  }
  if (NeedsCheckpointVolume(spec, role)) {
    // ParseJobSpec has checked it is a mapping; were it not to convert, the pod runs without it
    // (and the job's CheckpointsNotPersistent warning says why its checkpoints do not last).
    if (auto source = YamlToJson(spec.checkpoint.volumeYaml); source.ok() && source->is_object()) {
      const size_t n = mounts.size();
      Json m = Json::object();
      m["name"] = JStr(kCheckpointVolume);
      m["mountPath"] = JStr(spec.checkpoint.path);
      mounts[n] = m;
      Json v = *source;
      v["name"] = JStr(kCheckpointVolume);
      volumes[n] = v;
    }
  }
  if (spec.tls.enabled()) {
    Json env = container.has_field("env") ? container["env"] : Json::array();
    size_t n = env.size();
    std::map<std::string, std::string> vars;
    AddTlsEnv(TlsFilesOf(spec.tls), &vars);
    for (const auto& [k, v] : vars) env[n++] = EnvVar(k, v);
    container["env"] = env;
  }
  container["name"] = JStr("trellis");
  container["image"] = JStr(spec.image.empty() ? s.default_image : spec.image);
  container["volumeMounts"] = mounts;

  Json podspec = Json::object();
  // The agent restarts the program inside the pod; a pod that fails anyway is recreated by the
  // operator under the job's run policy, so the kubelet never restarts it on its own.
  podspec["restartPolicy"] = JStr("Never");
  podspec["hostname"] = JStr(name);
  // The time a stopped job's pods get, its exit checkpoint included
  // (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
  if (spec.runPolicy.terminationGracePeriodSeconds) {
    podspec["terminationGracePeriodSeconds"] = Json::number(*spec.runPolicy.terminationGracePeriodSeconds);
  }
  Json containers = Json::array();
  containers[0] = container;
  podspec["containers"] = containers;
  podspec["volumes"] = volumes;
  pod["spec"] = podspec;
  ApplySchedulingPolicy(job, spec, pod);
  return pod;
}

// Whether the pods run the operator's own image, whose user is not root (scripts/image.sh).
bool OwnImage(const JobSpec& spec, const OperatorSettings& s) {
  return spec.image.empty() || spec.image == s.default_image;
}

}  // namespace

bool NeedsCheckpointVolume(const JobSpec& spec, PodRole role) {
  if (spec.checkpoint.volumeYaml.empty()) return false;
  // Any worker may be rank 0 (ranks go by arrival); servers read and write files in update mode.
  return role == PodRole::kWorker || (role == PodRole::kServer && spec.serverMode == ServerMode::kUpdate);
}

bool CheckpointsOnAVolume(const JobSpec& spec) {
  if (spec.checkpoint.path.empty() || !spec.checkpoint.volumeYaml.empty()) return true;
  // A volume the user mounted at the path (or above it) in the workers' template.
  auto t = YamlToJson(spec.workers.templateYaml.empty() ? "{}" : spec.workers.templateYaml);
  const Json* containers = t.ok() ? At(*t, {"spec", "containers"}) : nullptr;
  if (!containers || !containers->is_array()) return false;
  for (size_t i = 0; i < containers->size(); ++i) {
    const Json& c = containers->at(i);
    if (!(Str(c, {"name"}) == "trellis" || (Str(c, {"name"}).empty() && i == 0))) continue;
    const Json* mounts = At(c, {"volumeMounts"});
    for (size_t j = 0; mounts && mounts->is_array() && j < mounts->size(); ++j) {
      std::string at = Str(mounts->at(j), {"mountPath"});
      while (at.size() > 1 && at.back() == '/') at.pop_back();
      const std::string& path = spec.checkpoint.path;
      if (!at.empty() && (path == at || (path.rfind(at, 0) == 0 && (at == "/" || path[at.size()] == '/')))) return true;
    }
  }
  return false;
}

void ApplyPodSecurityDefaults(Json& pod, bool non_root_image) {
  if (!At(pod, {"spec", "automountServiceAccountToken"})) {
    Put(pod, {"spec", "automountServiceAccountToken"}, Json::boolean(false));
  }
  if (!At(pod, {"spec", "securityContext"})) {
    Json sc = Json::object();
    Put(sc, {"seccompProfile", "type"}, JStr("RuntimeDefault"));
    if (non_root_image) sc["runAsNonRoot"] = Json::boolean(true);
    Put(pod, {"spec", "securityContext"}, sc);
  }
  const Json* containers = At(pod, {"spec", "containers"});
  if (!containers || !containers->is_array()) return;
  Json list = *containers;
  for (size_t i = 0; i < list.size(); ++i) {
    if (Str(list[i], {"name"}) != "trellis" || At(list[i], {"securityContext"})) continue;
    Json sc = Json::object();
    sc["allowPrivilegeEscalation"] = Json::boolean(false);
    Json drop = Json::array();
    drop[0] = JStr("ALL");
    Put(sc, {"capabilities", "drop"}, drop);
    list[i]["securityContext"] = sc;
  }
  Put(pod, {"spec", "containers"}, list);
}

std::string RoleName(PodRole r) {
  switch (r) {
    case PodRole::kScheduler: return "scheduler";
    case PodRole::kServer: return "server";
    case PodRole::kWorker: return "worker";
  }
  return "unknown";
}

StatusOr<JobMeta> JobMetaOf(const Json& job) {
  JobMeta m;
  m.name = Str(job, {"metadata", "name"});
  m.ns = Str(job, {"metadata", "namespace"}, "default");
  m.uid = Str(job, {"metadata", "uid"});
  if (m.name.empty()) return InvalidArgumentError("metadata.name: required field is missing");
  return m;
}

std::string PodName(const std::string& job, PodRole role, int index) {
  if (role == PodRole::kScheduler) return job + "-scheduler";
  return job + "-" + RoleName(role) + "-" + std::to_string(index);
}
std::string TokenSecretName(const std::string& job) { return job + "-token"; }
std::string ConfigMapName(const std::string& job) { return job + "-config"; }
std::string ServiceName(const std::string& job) { return job + "-scheduler"; }
std::string JobSelector(const std::string& job) { return std::string(kLabelJob) + "=" + job; }

Json OwnerReference(const JobMeta& job) {
  Json o = Json::object();
  o["apiVersion"] = JStr(kGroupVersion);
  o["kind"] = JStr("TrainingJob");
  o["name"] = JStr(job.name);
  o["uid"] = JStr(job.uid);
  o["controller"] = Json::boolean(true);
  o["blockOwnerDeletion"] = Json::boolean(true);
  return o;
}

Json TokenSecret(const JobMeta& job, const std::string& token) {
  Json s = Json::object();
  s["apiVersion"] = JStr("v1");
  s["kind"] = JStr("Secret");
  s["metadata"] = Metadata(job, TokenSecretName(job.name), "", -1, nullptr);
  s["type"] = JStr("Opaque");
  Put(s, {"stringData", "token"}, JStr(token));
  return s;
}

Json JobConfigMap(const JobMeta& job, const JobSpec& spec) {
  Json c = Json::object();
  c["apiVersion"] = JStr("v1");
  c["kind"] = JStr("ConfigMap");
  c["metadata"] = Metadata(job, ConfigMapName(job.name), "", -1, nullptr);
  Put(c, {"data", "job.yaml"}, JStr(JobSpecToYaml(spec)));
  return c;
}

Json SchedulerService(const JobMeta& job, const OperatorSettings& s) {
  Json svc = Json::object();
  svc["apiVersion"] = JStr("v1");
  svc["kind"] = JStr("Service");
  svc["metadata"] = Metadata(job, ServiceName(job.name), "scheduler", -1, nullptr);
  Json sel = Json::object();
  sel[kLabelJob] = JStr(job.name);
  sel[kLabelRole] = JStr("scheduler");
  Json port = Json::object();
  port["name"] = JStr("grpc");
  port["port"] = Json::number(s.scheduler_port);
  port["targetPort"] = Json::number(s.scheduler_port);
  port["protocol"] = JStr("TCP");
  Json ports = Json::array();
  ports[0] = port;
  svc["spec"] = Json::object();
  svc["spec"]["selector"] = sel;
  svc["spec"]["ports"] = ports;
  // Agents must reach the scheduler before it reports ready: headless, not-ready addresses published.
  svc["spec"]["clusterIP"] = JStr("None");
  svc["spec"]["publishNotReadyAddresses"] = Json::boolean(true);
  return svc;
}

Json SchedulerPod(const JobMeta& job, const JobSpec& spec, const OperatorSettings& s) {
  Json c = Json::object();
  // Listens on the pod's own address (TRELLIS_LISTEN_HOST), not every address of the pod.
  c["command"] = Strings({"trellis-scheduler", "--job-file", s.config_dir + "/job.yaml",
                          "--port", std::to_string(s.scheduler_port), "--token-file", s.token_dir + "/token",
                          "--job-name", job.name, "--metrics-port", std::to_string(s.metrics_port)});
  Json port = Json::object();
  port["name"] = JStr("grpc");
  port["containerPort"] = Json::number(s.scheduler_port);
  Json metrics = Json::object();
  metrics["name"] = JStr("metrics");
  metrics["containerPort"] = Json::number(s.metrics_port);
  Json ports = Json::array();
  ports[0] = port;
  ports[1] = metrics;
  c["ports"] = ports;
  Json env = Json::array();
  env[0] = FieldEnv(kEnvListenHost, "status.podIP");
  c["env"] = env;
  Json pod = PodShell(job, spec, PodRole::kScheduler, 0, s, c, /*with_config=*/true);
  ApplyPodSecurityDefaults(pod, OwnImage(spec, s));
  return pod;
}

Json RolePod(const JobMeta& job, const JobSpec& spec, PodRole role, int index, const OperatorSettings& s) {
  const bool server = role == PodRole::kServer;
  const RoleSpec& rs = server ? spec.servers : spec.workers;
  std::vector<std::string> argv = {"trellis-agent", "--restart-policy",
                                   std::string(ToString(spec.RestartPolicyFor(rs))), "--backoff-limit",
                                   std::to_string(spec.runPolicy.backoffLimit)};
  if (!rs.command.empty()) {
    argv.push_back("--");
    argv.insert(argv.end(), rs.command.begin(), rs.command.end());
    argv.insert(argv.end(), rs.args.begin(), rs.args.end());
  }
  Json c = Json::object();
  c["command"] = Strings(argv);
  Json env = Json::array();
  size_t n = 0;
  env[n++] = EnvVar(kEnvJob, job.name);
  env[n++] = EnvVar(kEnvScheduler, ServiceName(job.name) + ":" + std::to_string(s.scheduler_port));
  env[n++] = EnvVar(kEnvRole, RoleName(role));
  env[n++] = EnvVar(kEnvNumServers, std::to_string(spec.servers.replicas));
  env[n++] = EnvVar(kEnvNumWorkers, std::to_string(spec.workers.replicas));
  env[n++] = EnvVar(kEnvTokenFile, s.token_dir + "/token");
  env[n++] = FieldEnv(kEnvPodName, "metadata.name");
  env[n++] = FieldEnv(kEnvHost, "status.podIP");
  // Data ports and /metrics listen on the pod's address (where Services, Prometheus and the
  // other pods reach it), unless the role's env names another (e.g. 0.0.0.0).
  if (rs.env.count(kEnvListenHost) == 0) env[n++] = FieldEnv(kEnvListenHost, "status.podIP");
  // The program serves /metrics on the annotated port, its agent on the next one.
  env[n++] = EnvVar(kEnvMetricsPort, std::to_string(s.metrics_port));
  env[n++] = EnvVar(kEnvAgentMetricsPort, std::to_string(s.metrics_port + 1));
  if (!server && rs.gpusPerWorker > 0) env[n++] = EnvVar(kEnvGpus, std::to_string(rs.gpusPerWorker));
  for (const auto& [k, v] : rs.env) env[n++] = EnvVar(k, v);
  c["env"] = env;
  Json res = Resources(rs.requests, rs.limits, server ? 0 : rs.gpusPerWorker);
  if (res.size() > 0) c["resources"] = res;
  Json port = Json::object();
  port["name"] = JStr("metrics");
  port["containerPort"] = Json::number(s.metrics_port);
  Json agent_port = Json::object();
  agent_port["name"] = JStr("agent-metrics");
  agent_port["containerPort"] = Json::number(s.metrics_port + 1);
  Json ports = Json::array();
  ports[0] = port;
  ports[1] = agent_port;
  c["ports"] = ports;
  Json pod = PodShell(job, spec, role, index, s, c, /*with_config=*/false);
  // ParseJobSpec has checked the template is a mapping, so merging cannot fail here; were it
  // to, the pod without the template still runs the job.
  auto merged = ApplyPodTemplate(pod, rs.templateYaml);
  Json out = merged.ok() ? *merged : pod;
  ApplyPodSecurityDefaults(out, OwnImage(spec, s));  // after the template: its values win
  return out;
}

std::vector<DesiredPod> DesiredPodList(const std::string& job, const JobSpec& spec) {
  std::vector<int> workers(std::max(spec.workers.replicas, 0));
  std::iota(workers.begin(), workers.end(), 0);
  return DesiredPodList(job, spec, workers);
}

std::vector<DesiredPod> DesiredPodList(const std::string& job, const JobSpec& spec,
                                       const std::vector<int>& worker_slots) {
  std::vector<DesiredPod> pods = {{PodName(job, PodRole::kScheduler, 0), PodRole::kScheduler, 0}};
  for (int i = 0; i < spec.servers.replicas; ++i) pods.push_back({PodName(job, PodRole::kServer, i), PodRole::kServer, i});
  for (int i : worker_slots) pods.push_back({PodName(job, PodRole::kWorker, i), PodRole::kWorker, i});
  return pods;
}

Json BuildPod(const JobMeta& job, const JobSpec& spec, const DesiredPod& pod, const OperatorSettings& s) {
  if (pod.role == PodRole::kScheduler) return SchedulerPod(job, spec, s);
  return RolePod(job, spec, pod.role, pod.index, s);
}

std::vector<Json> DesiredPods(const JobMeta& job, const JobSpec& spec, const OperatorSettings& s) {
  std::vector<Json> pods;
  for (const DesiredPod& pod : DesiredPodList(job.name, spec)) pods.push_back(BuildPod(job, spec, pod, s));
  return pods;
}

}  // namespace trellis::op
