#include "operator/desired.h"

#include <gtest/gtest.h>

#include "tests/unit/operator/test_jobs.h"

namespace trellis::op {
namespace {

using testing::ApiJob;
using testing::kSpec;
using testing::Spec;

std::string EnvOf(const Json& pod, const std::string& name) {
  const Json& env = pod.at("spec").at("containers").at(0).at("env");
  for (size_t i = 0; i < env.size(); ++i) {
    if (Str(env.at(i), {"name"}) == name) {
      if (const Json* f = At(env.at(i), {"valueFrom", "fieldRef", "fieldPath"})) return "fieldRef:" + f->as_string();
      return Str(env.at(i), {"value"});
    }
  }
  return "<unset>";
}

std::vector<std::string> Command(const Json& pod) {
  std::vector<std::string> out;
  const Json& c = pod.at("spec").at("containers").at(0).at("command");
  for (size_t i = 0; i < c.size(); ++i) out.push_back(c.at(i).as_string());
  return out;
}

TEST(JobMetaTest, ReadsIdentityAndRejectsNameless) {
  auto m = JobMetaOf(ApiJob(kSpec));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->name, "mlp");
  EXPECT_EQ(m->ns, "team");
  EXPECT_EQ(m->uid, "u-1");
  auto bad = JobMetaOf(*ParseJson(R"({"metadata":{}})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "metadata.name: required field is missing");
}

TEST(DesiredTest, PodsNamedByRoleAndRankInOrder) {
  Json job = ApiJob(kSpec);
  auto pods = DesiredPods(*JobMetaOf(job), Spec(job), OperatorSettings{});
  std::vector<std::string> names;
  for (const auto& p : pods) names.push_back(Str(p, {"metadata", "name"}));
  EXPECT_EQ(names, (std::vector<std::string>{"mlp-scheduler", "mlp-server-0", "mlp-server-1", "mlp-worker-0",
                                             "mlp-worker-1", "mlp-worker-2"}));
}

TEST(DesiredTest, WorkerPodHasAgentEntrypointEnvLabelsOwnerAndResources) {
  Json job = ApiJob(kSpec);
  Json pod = RolePod(*JobMetaOf(job), Spec(job), PodRole::kWorker, 2, OperatorSettings{});
  EXPECT_EQ(Str(pod, {"metadata", "namespace"}), "team");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/job-name"}), "mlp");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/role"}), "worker");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/rank"}), "2");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "app"}), "demo");  // the job's labels are copied
  EXPECT_EQ(Str(pod, {"metadata", "annotations", "prometheus.io/scrape"}), "true");
  EXPECT_EQ(Str(pod, {"metadata", "annotations", "prometheus.io/port"}), "9100");
  EXPECT_EQ(Str(pod, {"metadata", "annotations", "prometheus.io/path"}), "/metrics");
  // The program serves /metrics on the annotated port, its agent on the next (docs/metrics.md).
  EXPECT_EQ(EnvOf(pod, "TRELLIS_METRICS_PORT"), "9100");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_AGENT_METRICS_PORT"), "9101");
  const Json& ports = pod.at("spec").at("containers").at(0).at("ports");
  EXPECT_EQ(Str(ports.at(1), {"name"}), "agent-metrics");
  EXPECT_EQ(Int(ports.at(1), {"containerPort"}), 9101);
  const Json& owner = pod.at("metadata").at("ownerReferences").at(0);
  EXPECT_EQ(Str(owner, {"kind"}), "TrainingJob");
  EXPECT_EQ(Str(owner, {"apiVersion"}), "trellis.io/v1alpha1");
  EXPECT_EQ(Str(owner, {"uid"}), "u-1");
  EXPECT_TRUE(Bool(owner, {"controller"}));
  EXPECT_EQ(Command(pod), (std::vector<std::string>{"trellis-agent", "--restart-policy", "OnFailure",
                                                    "--backoff-limit", "2", "--", "trellis-mlp", "--steps", "10"}));
  EXPECT_EQ(Str(pod, {"spec", "restartPolicy"}), "Never");
  EXPECT_EQ(Str(pod.at("spec").at("containers").at(0), {"image"}), "reg/trellis:1");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_JOB"), "mlp");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_SCHEDULER"), "mlp-scheduler:7000");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_ROLE"), "worker");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_NUM_SERVERS"), "2");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_NUM_WORKERS"), "3");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_TOKEN_FILE"), "/var/run/trellis/token");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_POD_NAME"), "fieldRef:metadata.name");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_HOST"), "fieldRef:status.podIP");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_LISTEN_HOST"), "fieldRef:status.podIP");  // not every address
  EXPECT_EQ(EnvOf(pod, "TRELLIS_GPUS"), "1");
  EXPECT_EQ(EnvOf(pod, "A"), "b");
  const Json& res = pod.at("spec").at("containers").at(0).at("resources");
  EXPECT_EQ(Str(res, {"requests", "cpu"}), "2");
  EXPECT_EQ(Str(res, {"requests", "memory"}), "4Gi");
  EXPECT_EQ(Str(res, {"limits", "nvidia.com/gpu"}), "1");
  EXPECT_EQ(Str(pod.at("spec").at("volumes").at(0), {"secret", "secretName"}), "mlp-token");
}

TEST(DesiredTest, ServerWithoutCommandRunsBuiltInPserverAndNoGpus) {
  Json job = ApiJob(R"({"workers":{"command":["w"]},"servers":{"restartPolicy":"Always"}})");
  Json pod = RolePod(*JobMetaOf(job), Spec(job), PodRole::kServer, 0, OperatorSettings{});
  EXPECT_EQ(Command(pod), (std::vector<std::string>{"trellis-agent", "--restart-policy", "Always",
                                                    "--backoff-limit", "3"}));
  EXPECT_EQ(EnvOf(pod, "TRELLIS_ROLE"), "server");
  EXPECT_EQ(EnvOf(pod, "TRELLIS_GPUS"), "<unset>");
  EXPECT_FALSE(pod.at("spec").at("containers").at(0).has_field("resources"));
  EXPECT_EQ(Str(pod.at("spec").at("containers").at(0), {"image"}), OperatorSettings{}.default_image);
}

// The servers' data ports and every /metrics port listen on the pod's address; a role's env
// naming TRELLIS_LISTEN_HOST (e.g. 0.0.0.0 for a sidecar on loopback) wins, and only it is set.
TEST(DesiredTest, RolePodsListenOnThePodAddressUnlessTheRoleEnvSaysOtherwise) {
  Json job = ApiJob(R"({"workers":{"command":["w"],"env":[{"name":"TRELLIS_LISTEN_HOST","value":"0.0.0.0"}]},"servers":{}})");
  Json server = RolePod(*JobMetaOf(job), Spec(job), PodRole::kServer, 1, OperatorSettings{});
  EXPECT_EQ(EnvOf(server, "TRELLIS_LISTEN_HOST"), "fieldRef:status.podIP");
  Json worker = RolePod(*JobMetaOf(job), Spec(job), PodRole::kWorker, 0, OperatorSettings{});
  EXPECT_EQ(EnvOf(worker, "TRELLIS_LISTEN_HOST"), "0.0.0.0");
  const Json& env = worker.at("spec").at("containers").at(0).at("env");
  int named = 0;
  for (size_t i = 0; i < env.size(); ++i) named += Str(env.at(i), {"name"}) == "TRELLIS_LISTEN_HOST";
  EXPECT_EQ(named, 1);
}

TEST(DesiredTest, SchedulerPodReadsJobFileFromConfigMapAndServiceSelectsIt) {
  Json job = ApiJob(kSpec);
  JobMeta meta = *JobMetaOf(job);
  JobSpec spec = Spec(job);
  Json pod = SchedulerPod(meta, spec, OperatorSettings{});
  EXPECT_EQ(Command(pod), (std::vector<std::string>{"trellis-scheduler", "--job-file", "/etc/trellis/job.yaml",
                                                    "--port", "7000", "--token-file",
                                                    "/var/run/trellis/token", "--job-name", "mlp",
                                                    "--metrics-port", "9100"}));
  // gRPC and /metrics on the pod's own address (no --host: the environment decides).
  EXPECT_EQ(EnvOf(pod, "TRELLIS_LISTEN_HOST"), "fieldRef:status.podIP");
  EXPECT_EQ(Str(pod, {"metadata", "labels", "trellis.io/role"}), "scheduler");
  EXPECT_FALSE(At(pod, {"metadata", "labels", "trellis.io/rank"}));
  Json cm = JobConfigMap(meta, spec);
  auto parsed = ParseJobSpec(Str(cm, {"data", "job.yaml"}));
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_EQ(*parsed, spec);  // the scheduler reads the very job the operator saw
  Json svc = SchedulerService(meta, OperatorSettings{});
  EXPECT_EQ(Str(svc, {"metadata", "name"}), "mlp-scheduler");
  EXPECT_EQ(Str(svc, {"spec", "selector", "trellis.io/role"}), "scheduler");
  EXPECT_EQ(Int(svc.at("spec").at("ports").at(0), {"port"}), 7000);
  Json secret = TokenSecret(meta, "s3cret");
  EXPECT_EQ(Str(secret, {"stringData", "token"}), "s3cret");
  EXPECT_EQ(Str(secret.at("metadata").at("ownerReferences").at(0), {"name"}), "mlp");
}

}  // namespace
}  // namespace trellis::op

namespace trellis::op {
namespace {

// spec.tls.secretName: every pod mounts the Secret where the TLS paths point and has
// TRELLIS_TLS_* (docs/operations.md#tls); without it, no such volume nor variable.
TEST(DesiredTest, TlsSecretIsMountedAndNamedInEveryPod) {
  Json job = ApiJob(kSpec);
  JobSpec spec = Spec(job);
  EXPECT_EQ(EnvOf(RolePod(*JobMetaOf(job), spec, PodRole::kWorker, 0, OperatorSettings{}),
                  "TRELLIS_TLS_CA_FILE"),
            "<unset>");
  spec.tls.secretName = "mlp-tls";
  spec.tls.caFile = "/etc/trellis/tls/ca.crt";
  spec.tls.certFile = "/etc/trellis/tls/tls.crt";
  spec.tls.keyFile = "/etc/trellis/tls/tls.key";
  const JobMeta meta = *JobMetaOf(job);
  for (const Json& pod : {RolePod(meta, spec, PodRole::kWorker, 0, OperatorSettings{}),
                          RolePod(meta, spec, PodRole::kServer, 1, OperatorSettings{}),
                          SchedulerPod(meta, spec, OperatorSettings{})}) {
    const std::string name = Str(pod, {"metadata", "name"});
    EXPECT_EQ(EnvOf(pod, "TRELLIS_TLS_CA_FILE"), "/etc/trellis/tls/ca.crt") << name;
    EXPECT_EQ(EnvOf(pod, "TRELLIS_TLS_KEY_FILE"), "/etc/trellis/tls/tls.key") << name;
    EXPECT_EQ(EnvOf(pod, "TRELLIS_TLS_SERVER_NAME"), "trellis") << name;
    const Json& volumes = pod.at("spec").at("volumes");
    const Json& mounts = pod.at("spec").at("containers").at(0).at("volumeMounts");
    bool mounted = false;
    for (size_t i = 0; i < volumes.size(); ++i) {
      if (Str(volumes.at(i), {"name"}) != "tls") continue;
      EXPECT_EQ(Str(volumes.at(i), {"secret", "secretName"}), "mlp-tls") << name;
      for (size_t m = 0; m < mounts.size(); ++m) {
        if (Str(mounts.at(m), {"name"}) == "tls") {
          mounted = Str(mounts.at(m), {"mountPath"}) == "/etc/trellis/tls";
        }
      }
    }
    EXPECT_TRUE(mounted) << name;
  }
}

}  // namespace
}  // namespace trellis::op

namespace trellis::op {
namespace {

// Issue 32: no Trellis process talks to the API server, so no pod gets a service-account token;
// every pod gets a restrictive securityContext -- runAsNonRoot only with the operator's own
// image (user 1000) -- unless its template sets its own, which wins whole.
TEST(DesiredTest, PodsGetNoTokenAndARestrictiveSecurityContextUnlessTheTemplateSaysOtherwise) {
  Json job = ApiJob(kSpec);  // reg/trellis:1, not the operator's own image
  const JobMeta meta = *JobMetaOf(job);
  JobSpec spec = Spec(job);
  const OperatorSettings s;
  for (const Json& pod : DesiredPods(meta, spec, s)) {
    const std::string name = Str(pod, {"metadata", "name"});
    EXPECT_EQ(pod.at("spec").at("automountServiceAccountToken"), Json::boolean(false)) << name;
    EXPECT_EQ(Str(pod, {"spec", "securityContext", "seccompProfile", "type"}), "RuntimeDefault") << name;
    EXPECT_EQ(At(pod, {"spec", "securityContext", "runAsNonRoot"}), nullptr) << name;  // the image's user is unknown
    const Json& c = pod.at("spec").at("containers").at(0);
    EXPECT_EQ(c.at("securityContext").serialize(),
              R"({"allowPrivilegeEscalation":false,"capabilities":{"drop":["ALL"]}})") << name;
  }
  spec.image.clear();  // the operator's own image: its user is not root
  for (const Json& pod : DesiredPods(meta, spec, s)) {
    EXPECT_EQ(pod.at("spec").at("securityContext").at("runAsNonRoot"), Json::boolean(true));
  }
  Json own = ApiJob(R"({"workers":{"command":["w"],"template":{"spec":{"automountServiceAccountToken":true,
      "securityContext":{"runAsUser":0},"containers":[{"name":"trellis","securityContext":{"privileged":true}}]}}}})");
  Json pod = RolePod(*JobMetaOf(own), Spec(own), PodRole::kWorker, 0, s);
  EXPECT_EQ(pod.at("spec").at("automountServiceAccountToken"), Json::boolean(true));
  EXPECT_EQ(pod.at("spec").at("securityContext").serialize(), R"({"runAsUser":0})");
  EXPECT_EQ(pod.at("spec").at("containers").at(0).at("securityContext").serialize(), R"({"privileged":true})");
}

// A stopped job's pods get the job's grace for the exit checkpoint (docs/checkpoints.md);
// without runPolicy.terminationGracePeriodSeconds they keep Kubernetes' default (30 s).
TEST(DesiredTest, PodsGetTheJobsTerminationGraceWhenItSetsOne) {
  Json job = ApiJob(kSpec);
  const JobMeta meta = *JobMetaOf(job);
  JobSpec spec = Spec(job);
  const OperatorSettings s;
  for (const Json& pod : DesiredPods(meta, spec, s)) {
    EXPECT_EQ(At(pod, {"spec", "terminationGracePeriodSeconds"}), nullptr) << Str(pod, {"metadata", "name"});
  }
  spec.runPolicy.terminationGracePeriodSeconds = 120;
  const auto pods = DesiredPods(meta, spec, s);
  ASSERT_FALSE(pods.empty());
  for (const Json& pod : pods) {
    EXPECT_EQ(pod.at("spec").at("terminationGracePeriodSeconds"), Json::number(120))
        << Str(pod, {"metadata", "name"});
  }
}

}  // namespace
}  // namespace trellis::op

namespace trellis::op {
namespace {

// spec.checkpoint.volume (docs/checkpoints.md#on-kubernetes): mounted, writable, at the
// checkpoint path in every worker pod and, in update mode, every server pod; the scheduler never.
TEST(DesiredTest, TheCheckpointVolumeIsMountedAtThePathInThePodsThatReadOrWriteCheckpoints) {
  Json job = ApiJob(kSpec);
  const JobMeta meta = *JobMetaOf(job);
  JobSpec spec = Spec(job);
  spec.checkpoint.path = "/ckpt/mlp";
  EXPECT_FALSE(CheckpointsOnAVolume(spec)) << "a path on no volume dies with the pods";
  spec.checkpoint.volumeYaml = "persistentVolumeClaim:\n  claimName: mlp-ckpt\n";
  EXPECT_TRUE(CheckpointsOnAVolume(spec));
  auto mounted = [](const Json& pod) -> std::string {
    const Json& volumes = pod.at("spec").at("volumes");
    const Json& mounts = pod.at("spec").at("containers").at(0).at("volumeMounts");
    std::string claim;
    for (size_t i = 0; i < volumes.size(); ++i) {
      if (Str(volumes.at(i), {"name"}) == kCheckpointVolume) claim = Str(volumes.at(i), {"persistentVolumeClaim", "claimName"});
    }
    for (size_t m = 0; m < mounts.size(); ++m) {
      if (Str(mounts.at(m), {"name"}) != kCheckpointVolume) continue;
      EXPECT_FALSE(Bool(mounts.at(m), {"readOnly"}));
      return claim + "@" + Str(mounts.at(m), {"mountPath"});
    }
    return claim.empty() ? "" : claim + "@<not mounted>";
  };
  const OperatorSettings s;
  EXPECT_EQ(mounted(RolePod(meta, spec, PodRole::kWorker, 0, s)), "mlp-ckpt@/ckpt/mlp");
  EXPECT_EQ(mounted(RolePod(meta, spec, PodRole::kWorker, 2, s)), "mlp-ckpt@/ckpt/mlp") << "any worker may be rank 0";
  EXPECT_EQ(mounted(RolePod(meta, spec, PodRole::kServer, 0, s)), "") << "aggregate-mode servers read no checkpoint";
  EXPECT_EQ(mounted(SchedulerPod(meta, spec, s)), "");
  spec.serverMode = ServerMode::kUpdate;
  EXPECT_EQ(mounted(RolePod(meta, spec, PodRole::kServer, 1, s)), "mlp-ckpt@/ckpt/mlp");

  // A volume the workers' template mounts at the path, or above it, is as good.
  spec.checkpoint.volumeYaml.clear();
  spec.workers.templateYaml = "spec:\n  containers:\n  - name: trellis\n    volumeMounts:\n    - {name: data, mountPath: /ckpt/}\n";
  EXPECT_TRUE(CheckpointsOnAVolume(spec));
  spec.workers.templateYaml = "spec:\n  containers:\n  - name: trellis\n    volumeMounts:\n    - {name: data, mountPath: /ck}\n";
  EXPECT_FALSE(CheckpointsOnAVolume(spec)) << "/ck is not above /ckpt/mlp";
}

}  // namespace
}  // namespace trellis::op
