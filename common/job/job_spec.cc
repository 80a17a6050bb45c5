// TrainingJob parsing and validation: the schema, field by field. The error format
// ("<field path>: <what is wrong>, got <value>", one per line) is documented in docs/job-spec.md
// and shown verbatim in operator status conditions, so change it only together with the doc.
#include "common/job/job_spec.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <sys/stat.h>

#include <yaml-cpp/yaml.h>

#include "common/job/job_spec_tls.h"
#include "common/job/scheduling_policy.h"
#include "common/base/text_match.h"
#include "common/job/yaml_emit.h"
#include "common/job/yaml_fields.h"
#include "common/job/yaml_load.h"

namespace trellis {
namespace {

using yaml::Errors;
using yaml::MapReader;

template <typename E>
using Names = std::vector<std::pair<std::string_view, E>>;

const Names<RestartPolicy>& RestartPolicyNames() {
  static const Names<RestartPolicy> n = {{"Never", RestartPolicy::kNever},
                                         {"OnFailure", RestartPolicy::kOnFailure},
                                         {"Always", RestartPolicy::kAlways},
                                         {"ExitCode", RestartPolicy::kExitCode}};
  return n;
}
const Names<KeyDispatch>& KeyDispatchNames() {
  static const Names<KeyDispatch> n = {{"roundRobin", KeyDispatch::kRoundRobin},
                                       {"hash", KeyDispatch::kHash},
                                       {"balanced", KeyDispatch::kBalanced}};
  return n;
}
const Names<CompressionType>& CompressionTypeNames() {
  static const Names<CompressionType> n = {{"none", CompressionType::kNone},
                                           {"2bit", CompressionType::kTwoBit},
                                           {"fp16", CompressionType::kFloat16},
                                           {"bf16", CompressionType::kBFloat16}};
  return n;
}
const Names<ServerMode>& ServerModeNames() {
  static const Names<ServerMode> n = {{"aggregate", ServerMode::kAggregate},
                                      {"update", ServerMode::kUpdate}};
  return n;
}
const Names<Transport>& TransportNames() {
  static const Names<Transport> n = {{"tcp", Transport::kTcp}, {"grpc", Transport::kGrpc}};
  return n;
}
const Names<OptimizerType>& OptimizerTypeNames() {
  static const Names<OptimizerType> n = {{"sgd", OptimizerType::kSgd},
                                         {"adam", OptimizerType::kAdam}};
  return n;
}
const Names<CleanPodPolicy>& CleanPodPolicyNames() {
  static const Names<CleanPodPolicy> n = {{"None", CleanPodPolicy::kNone},
                                          {"Running", CleanPodPolicy::kRunning},
                                          {"All", CleanPodPolicy::kAll}};
  return n;
}
const Names<FailurePolicy>& FailurePolicyNames() {
  static const Names<FailurePolicy> n = {{"FailJob", FailurePolicy::kFailJob},
                                         {"RestartJob", FailurePolicy::kRestartJob}};
  return n;
}

template <typename E>
std::string_view NameOf(const Names<E>& names, E v) {
  for (const auto& [name, value] : names) {
    if (value == v) return name;
  }
  return "unknown";
}

template <typename E>
std::optional<E> ValueOf(const Names<E>& names, std::string_view s) {
  for (const auto& [name, value] : names) {
    if (name == s) return value;
  }
  return std::nullopt;
}

// An integer field within [lo, hi]; *out is set only when the value is valid.
template <typename T>
bool IntField(const MapReader& m, std::string_view key, int64_t lo, int64_t hi, T* out) {
  int64_t v = 0;
  if (!m.GetInt(key, &v)) return false;
  if (v < lo) {
    m.errors()->AddGot(m.Path(key), "must be >= " + std::to_string(lo), m.Get(key));
    return false;
  }
  if (v > hi) {
    m.errors()->AddGot(m.Path(key), "must be <= " + std::to_string(hi), m.Get(key));
    return false;
  }
  *out = static_cast<T>(v);
  return true;
}

// A number field that `valid` accepts; `rule` says what valid means ("must be > 0").
template <typename Pred>
bool DoubleField(const MapReader& m, std::string_view key, std::string_view rule, Pred valid,
                 double* out) {
  double v = 0;
  if (!m.GetDouble(key, &v)) return false;
  if (!valid(v)) {
    m.errors()->AddGot(m.Path(key), rule, m.Get(key));
    return false;
  }
  *out = v;
  return true;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

using text::IsDns1123Label;

constexpr std::string_view kDnsLabelRule =
    "must be a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a "
    "letter or digit)";

// Kubernetes resource quantities: 2, 500m, 1.5, 4Gi, 1e3, 128M; none is longer than 64.
bool IsQuantity(const std::string& s) { return s.size() <= 64 && text::IsQuantity(s); }

void ParseResources(const MapReader& role, RoleSpec* out) {
  MapReader res(role.Get("resources"), role.Path("resources"), role.errors(),
                {"requests", "limits"});
  auto one = [&](std::string_view key, ResourceSpec* spec) {
    MapReader r(res.Get(key), res.Path(key), res.errors(), {"cpu", "memory"});
    for (auto [name, field] : {std::pair{"cpu", &spec->cpu}, std::pair{"memory", &spec->memory}}) {
      std::string v;
      if (!r.GetString(name, &v)) continue;
      if (!IsQuantity(v)) {
        r.errors()->AddGot(r.Path(name), "must be a Kubernetes quantity such as 500m, 2 or 4Gi",
                           r.Get(name));
        continue;
      }
      *field = v;
    }
  };
  one("requests", &out->requests);
  one("limits", &out->limits);
}

void ParseEnv(const MapReader& role, RoleSpec* out) {
  YAML::Node env = role.Get("env");
  if (!env.IsDefined()) return;
  const std::string path = role.Path("env");
  if (!env.IsSequence()) {
    role.errors()->AddGot(path, "must be a sequence of {name, value}", env);
    return;
  }
  for (size_t i = 0; i < env.size(); ++i) {
    MapReader item(env[i], path + "[" + std::to_string(i) + "]", role.errors(), {"name", "value"});
    if (!env[i].IsMap() && !env[i].IsNull()) continue;  // "must be a mapping" is recorded
    std::string name;
    std::string value;
    if (!item.GetString("name", &name)) {
      if (!item.Has("name")) role.errors()->Add(item.Path("name"), "required field is missing");
      continue;
    }
    if (name.empty() || name.find('=') != std::string::npos) {
      role.errors()->AddGot(item.Path("name"), "must be non-empty and without '='",
                            item.Get("name"));
      continue;
    }
    item.GetString("value", &value);
    if (!out->env.emplace(name, value).second) {
      role.errors()->AddGot(item.Path("name"), "duplicate variable", item.Get("name"));
    }
  }
}

void ParseRole(const MapReader& spec, std::string_view key, bool is_workers, RoleSpec* out) {
  std::vector<std::string_view> known = {"replicas", "command",       "args",    "env",
                                         "resources", "restartPolicy", "template"};
  std::vector<std::string_view> ignored;
  (is_workers ? known : ignored).push_back("gpusPerWorker");
  MapReader role(spec.Get(key), spec.Path(key), spec.errors(), known, ignored);
  Errors* errors = spec.errors();

  IntField(role, "replicas", 1, kMaxReplicas, &out->replicas);
  if (role.GetStringList("command", &out->command)) {
    if (is_workers && out->command.empty()) {
      errors->AddGot(role.Path("command"), "must not be empty", role.Get("command"));
    } else if (!out->command.empty() && out->command[0].empty()) {
      errors->Add(role.Path("command") + "[0]", "must not be empty, got \"\"");
    }
  } else if (is_workers && !role.Has("command") && (role.is_mapping() || !spec.Has(key))) {
    // The program to train with has no default. (Not repeated when the role is no mapping.)
    errors->Add(role.Path("command"), "required field is missing");
  }
  role.GetStringList("args", &out->args);
  ParseEnv(role, out);
  ParseResources(role, out);
  if (is_workers) {
    IntField(role, "gpusPerWorker", 0, kMaxGpusPerWorker, &out->gpusPerWorker);
  } else if (role.Has("gpusPerWorker")) {
    errors->AddGot(role.Path("gpusPerWorker"), "only allowed under spec.workers",
                   role.Get("gpusPerWorker"));
  }
  RestartPolicy policy;
  if (role.GetEnum("restartPolicy", RestartPolicyNames(), &policy)) out->restartPolicy = policy;
  if (YAML::Node t = role.Get("template"); t.IsDefined()) {
    if (t.IsMap()) {
      out->templateYaml = yaml::NodeToYaml(t);
    } else {
      errors->AddGot(role.Path("template"), "must be a mapping (a pod template)", t);
    }
  }
}

void ParseSliceBytes(const MapReader& spec, JobSpec* out) {
  YAML::Node v = spec.Get("sliceBytes");
  if (!v.IsDefined()) return;
  const std::string path = spec.Path("sliceBytes");
  int64_t bytes = 0;
  if (auto i = yaml::ParseInt(v)) {
    bytes = *i;
  } else if (v.IsScalar()) {
    auto q = ParseByteQuantity(v.Scalar());
    if (!q.ok()) {
      if (q.status().code() == StatusCode::kOutOfRange) {
        spec.errors()->AddGot(path, "must be <= 1Gi (1073741824)", v);
      } else {
        spec.errors()->AddGot(
            path, "must be a number of bytes or a quantity such as 512Ki, 4Mi or 1Gi", v);
      }
      return;
    }
    bytes = *q;
  } else {
    spec.errors()->AddGot(path, "must be a number of bytes or a quantity such as 512Ki, 4Mi or 1Gi",
                          v);
    return;
  }
  if (bytes < kMinSliceBytes) {
    spec.errors()->AddGot(path, "must be >= 4", v);
  } else if (bytes > kMaxSliceBytes) {
    spec.errors()->AddGot(path, "must be <= 1Gi (1073741824)", v);
  } else if (bytes % 4 != 0) {
    spec.errors()->AddGot(path, "must be a multiple of 4 (whole float32 values)", v);
  } else {
    out->sliceBytes = bytes;
  }
}

// spec.elastic: minWorkers <= workers.replicas <= maxWorkers, both required; minServers <=
// servers.replicas <= maxServers, each defaulting to servers.replicas.
void ParseElastic(const MapReader& spec, JobSpec* out) {
  if (!spec.Has("elastic")) return;
  MapReader el(spec.Get("elastic"), spec.Path("elastic"), spec.errors(),
               {"minWorkers", "maxWorkers", "minServers", "maxServers"});
  if (!el.is_mapping()) return;
  ElasticSpec& e = out->elastic;
  const int32_t replicas = out->workers.replicas;
  bool ok = true;
  for (const char* key : {"minWorkers", "maxWorkers"}) {
    if (!el.Has(key)) {
      spec.errors()->Add(el.Path(key), "required field is missing");
      ok = false;
    }
  }
  const std::string r = "spec.workers.replicas (" + std::to_string(replicas) + ")";
  // A bound in [lo, hi], each end named as the rule says it (a number or the replicas).
  auto bound = [&](const char* key, int64_t lo, const std::string& lo_text, int64_t hi,
                   const std::string& hi_text, int32_t* field) {
    int64_t v = 0;
    if (!el.GetInt(key, &v)) return false;
    if (v < lo || v > hi) {
      spec.errors()->AddGot(el.Path(key), v < lo ? "must be >= " + lo_text : "must be <= " + hi_text,
                            el.Get(key));
      return false;
    }
    *field = static_cast<int32_t>(v);
    return true;
  };
  ok = bound("minWorkers", 1, "1", replicas, r, &e.minWorkers) && ok;
  ok = bound("maxWorkers", replicas, r, kMaxReplicas, std::to_string(kMaxReplicas),
             &e.maxWorkers) && ok;
  const int32_t servers = out->servers.replicas;
  const std::string sr = "spec.servers.replicas (" + std::to_string(servers) + ")";
  e.minServers = e.maxServers = servers;
  if (el.Has("minServers")) ok = bound("minServers", 1, "1", servers, sr, &e.minServers) && ok;
  if (el.Has("maxServers")) {
    ok = bound("maxServers", servers, sr, kMaxReplicas, std::to_string(kMaxReplicas), &e.maxServers) && ok;
  }
  if (out->workers.gpusPerWorker > 1) {
    spec.errors()->Add(spec.Path("elastic"), "multi-GPU workers (spec.workers.gpusPerWorker " +
                                        std::to_string(out->workers.gpusPerWorker) +
                                        ") cannot be resized yet; remove spec.elastic");
    ok = false;
  }
  e.enabled = ok;
}

void ParseSpec(const MapReader& spec, JobSpec* out) {
  Errors* errors = spec.errors();
  spec.GetString("image", &out->image);
  ParseRole(spec, "servers", /*is_workers=*/false, &out->servers);
  ParseRole(spec, "workers", /*is_workers=*/true, &out->workers);
  spec.GetEnum("keyDispatch", KeyDispatchNames(), &out->keyDispatch);
  ParseSliceBytes(spec, out);

  MapReader prio(spec.Get("priority"), spec.Path("priority"), errors, {"enabled", "waterMark"});
  prio.GetBool("enabled", &out->priority.enabled);
  IntField(prio, "waterMark", 1, kInt32Max, &out->priority.waterMark);

  MapReader bulk(spec.Get("bulking"), spec.Path("bulking"), errors,
                 {"enabled", "thresholdBytes", "pushMaxBytes", "pushMaxCount", "pullMaxBytes",
                  "pullMaxCount"});
  bulk.GetBool("enabled", &out->bulking.enabled);
  IntField(bulk, "thresholdBytes", 4, kMaxBulkBytes, &out->bulking.thresholdBytes);
  IntField(bulk, "pushMaxBytes", 4, kMaxBulkBytes, &out->bulking.pushMaxBytes);
  IntField(bulk, "pushMaxCount", 1, kMaxBulkCount, &out->bulking.pushMaxCount);
  IntField(bulk, "pullMaxBytes", 4, kMaxBulkBytes, &out->bulking.pullMaxBytes);
  IntField(bulk, "pullMaxCount", 1, kMaxBulkCount, &out->bulking.pullMaxCount);

  MapReader comp(spec.Get("compression"), spec.Path("compression"), errors,
                 {"type", "threshold", "warmupSteps", "packedPulls"});
  comp.GetEnum("type", CompressionTypeNames(), &out->compression.type);
  // The codec works in float32: the threshold must stay > 0 and finite as a float.
  DoubleField(comp, "threshold", "must be > 0 and within float32 range",
              [](double v) { return v > 0 && v <= 3.4e38 && static_cast<float>(v) > 0; },
              &out->compression.threshold);
  IntField(comp, "warmupSteps", 0, kInt64Max, &out->compression.warmupSteps);
  comp.GetBool("packedPulls", &out->compression.packedPulls);

  spec.GetEnum("serverMode", ServerModeNames(), &out->serverMode);
  spec.GetEnum("transport", TransportNames(), &out->transport);

  MapReader opt(spec.Get("optimizer"), spec.Path("optimizer"), errors,
                {"type", "learningRate", "momentum", "beta1", "beta2", "epsilon", "weightDecay"});
  OptimizerSpec& o = out->optimizer;
  opt.GetEnum("type", OptimizerTypeNames(), &o.type);
  auto positive = [](double v) { return v > 0; };
  auto unit = [](double v) { return v >= 0 && v < 1; };
  DoubleField(opt, "learningRate", "must be > 0", positive, &o.learningRate);
  DoubleField(opt, "momentum", "must be in [0, 1)", unit, &o.momentum);
  DoubleField(opt, "beta1", "must be in [0, 1)", unit, &o.beta1);
  DoubleField(opt, "beta2", "must be in [0, 1)", unit, &o.beta2);
  DoubleField(opt, "epsilon", "must be > 0", positive, &o.epsilon);
  DoubleField(opt, "weightDecay", "must be >= 0", [](double v) { return v >= 0; },
              &o.weightDecay);

  MapReader ckpt(spec.Get("checkpoint"), spec.Path("checkpoint"), errors,
                 {"path", "intervalSteps", "keep", "volume"});
  ckpt.GetString("path", &out->checkpoint.path);
  if (IntField(ckpt, "intervalSteps", 0, kInt64Max, &out->checkpoint.intervalSteps) &&
      out->checkpoint.intervalSteps > 0 && out->checkpoint.path.empty()) {
    errors->AddGot(ckpt.Path("path"), "must be set when spec.checkpoint.intervalSteps > 0",
                   ckpt.Get("path"));
  }
  IntField(ckpt, "keep", 1, kInt32Max, &out->checkpoint.keep);
  if (YAML::Node v = ckpt.Get("volume"); v.IsDefined()) {
    if (!v.IsMap() || v.size() == 0) {
      errors->AddGot(ckpt.Path("volume"), "must be a Kubernetes volume source (persistentVolumeClaim, hostPath, ...)", v);
    } else if (v["name"].IsDefined()) {
      errors->AddGot(ckpt.Path("volume.name"), "not allowed: the operator names the volume", v["name"]);
    } else if (out->checkpoint.path.empty()) {
      errors->AddGot(ckpt.Path("path"), "must be set when spec.checkpoint.volume is (where it is mounted)",
                     ckpt.Get("path"));
    } else {
      out->checkpoint.volumeYaml = yaml::NodeToYaml(v);
    }
  }

  MapReader rec(spec.Get("recovery"), spec.Path("recovery"), errors, {"retainPushes"});
  rec.GetBool("retainPushes", &out->recovery.retainPushes);

  MapReader run(spec.Get("runPolicy"), spec.Path("runPolicy"), errors,
                {"restartPolicy", "backoffLimit", "activeDeadlineSeconds",
                 "ttlSecondsAfterFinished", "terminationGracePeriodSeconds", "cleanPodPolicy",
                 "failurePolicy", "suspend", "schedulingPolicy"});
  RunPolicySpec& r = out->runPolicy;
  run.GetEnum("restartPolicy", RestartPolicyNames(), &r.restartPolicy);
  IntField(run, "backoffLimit", 0, kInt32Max, &r.backoffLimit);
  int64_t v = 0;
  if (IntField(run, "activeDeadlineSeconds", 1, kInt64Max, &v)) r.activeDeadlineSeconds = v;
  if (IntField(run, "ttlSecondsAfterFinished", 0, kInt64Max, &v)) r.ttlSecondsAfterFinished = v;
  // An hour at most: a stop that takes longer is a hang, and Kubernetes would hold the pods.
  if (IntField(run, "terminationGracePeriodSeconds", 1, 3600, &v)) r.terminationGracePeriodSeconds = v;
  run.GetEnum("cleanPodPolicy", CleanPodPolicyNames(), &r.cleanPodPolicy);
  run.GetEnum("failurePolicy", FailurePolicyNames(), &r.failurePolicy);
  run.GetBool("suspend", &r.suspend);
  ParseSchedulingPolicy(run, &r.schedulingPolicy);

  MapReader sched(spec.Get("scheduler"), spec.Path("scheduler"), errors,
                  {"heartbeatIntervalSeconds", "heartbeatTimeoutSeconds",
                   "registrationTimeoutSeconds", "livenessTimeoutSeconds",
                   "progressTimeoutSeconds"});
  SchedulerSpec& s = out->scheduler;
  bool interval_ok = true;
  if (sched.Has("heartbeatIntervalSeconds")) {
    interval_ok = DoubleField(sched, "heartbeatIntervalSeconds", "must be > 0", positive,
                              &s.heartbeatIntervalSeconds);
  }
  // Checked against the interval only when that one is valid: one mistake, one message.
  const std::string rule = "must be > spec.scheduler.heartbeatIntervalSeconds (" +
                           yaml::FormatDouble(s.heartbeatIntervalSeconds) + ")";
  double timeout = 0;
  if (sched.GetDouble("heartbeatTimeoutSeconds", &timeout)) {
    if (interval_ok && !(timeout > s.heartbeatIntervalSeconds)) {
      errors->AddGot(sched.Path("heartbeatTimeoutSeconds"), rule,
                     sched.Get("heartbeatTimeoutSeconds"));
    } else {
      s.heartbeatTimeoutSeconds = timeout;
    }
  } else if (!sched.Has("heartbeatTimeoutSeconds") && interval_ok &&
             !(s.heartbeatTimeoutSeconds > s.heartbeatIntervalSeconds)) {
    errors->Add(sched.Path("heartbeatTimeoutSeconds"),
                rule + ", got " + yaml::FormatDouble(s.heartbeatTimeoutSeconds) + " (default)");
  }
  DoubleField(sched, "registrationTimeoutSeconds", "must be > 0", positive,
              &s.registrationTimeoutSeconds);
  // The programs ping every heartbeat interval: a liveness bound must leave room for a few.
  double liveness = 0;
  if (sched.GetDouble("livenessTimeoutSeconds", &liveness)) {
    if (interval_ok && !(liveness == 0 || liveness > s.heartbeatIntervalSeconds)) {
      errors->AddGot(sched.Path("livenessTimeoutSeconds"),
                     "must be 0 (off) or > spec.scheduler.heartbeatIntervalSeconds (" +
                         yaml::FormatDouble(s.heartbeatIntervalSeconds) + ")",
                     sched.Get("livenessTimeoutSeconds"));
    } else if (liveness >= 0) {
      s.livenessTimeoutSeconds = liveness;
    }
  } else if (!sched.Has("livenessTimeoutSeconds")) {
    // The default leaves room for at least 3 pings whatever the interval.
    s.livenessTimeoutSeconds = std::max(s.livenessTimeoutSeconds, 3 * s.heartbeatIntervalSeconds);
  }
  DoubleField(sched, "progressTimeoutSeconds", "must be in [0, 86400] (0: off)",
              [](double v) { return v >= 0 && v <= 86400; }, &s.progressTimeoutSeconds);

  ParseElastic(spec, out);

  MapReader mon(spec.Get("monitoring"), spec.Path("monitoring"), errors, {"straggler"});
  MapReader strag(mon.Get("straggler"), mon.Path("straggler"), errors,
                  {"factor", "windowSeconds"});
  DoubleField(strag, "factor", "must be in (1, 1000000]",
              [](double v) { return v > 1 && v <= 1e6; },
              &out->monitoring.straggler.factor);
  DoubleField(strag, "windowSeconds", "must be in (0, 86400]",
              [](double v) { return v > 0 && v <= 86400; },
              &out->monitoring.straggler.windowSeconds);
}

void ParseMetadata(const MapReader& top, JobSpec* out) {
  // ObjectMeta fields the API server adds; they mean nothing to Trellis.
  MapReader meta(top.Get("metadata"), "metadata", top.errors(), {"name", "namespace", "labels"},
                 {"uid", "resourceVersion", "creationTimestamp", "generation", "annotations",
                  "managedFields", "ownerReferences", "finalizers", "generateName", "selfLink",
                  "deletionTimestamp", "deletionGracePeriodSeconds", "clusterName"});
  Errors* errors = top.errors();
  if (!top.Has("metadata")) {
    errors->Add("metadata.name", "required field is missing");
  } else if (meta.is_mapping() && !meta.Has("name")) {
    errors->Add("metadata.name", "required field is missing");
  }
  std::string name;
  if (meta.GetString("name", &name)) {
    if (name.size() <= kMaxJobNameLength && !IsDns1123Label(name)) {
      errors->AddGot("metadata.name", kDnsLabelRule, meta.Get("name"));
    } else if (name.size() > kMaxJobNameLength) {
      errors->AddGot("metadata.name",
                     "must be at most 50 characters (pod names are <name>-worker-<i>)",
                     meta.Get("name"));
    } else {
      out->name = name;
    }
  }
  std::string ns;
  if (meta.GetString("namespace", &ns)) {
    if (!IsDns1123Label(ns) || ns.size() > 63) {
      errors->AddGot("metadata.namespace", std::string(kDnsLabelRule) + " of at most 63 characters",
                     meta.Get("namespace"));
    } else {
      out->ns = ns;
    }
  }
  meta.GetStringMap("labels", &out->labels);
}

void CheckExact(const MapReader& top, std::string_view key, std::string_view expected) {
  const std::string want = yaml::Quote(expected);
  YAML::Node v = top.Get(key);
  if (!v.IsDefined()) {
    top.errors()->Add(key, "required field is missing, expected " + want);
  } else if (!v.IsScalar() || v.Scalar() != expected) {
    top.errors()->AddGot(key, "must be " + want, v);
  }
}

StatusOr<JobSpec> ParseDocument(const YAML::Node& root) {
  Errors errors;
  if (!root.IsDefined() || root.IsNull()) {
    errors.Add("document", "must be a TrainingJob mapping, got an empty document");
    return errors.ToStatus();
  }
  if (!root.IsMap()) {
    errors.AddGot("document", "must be a TrainingJob mapping", root);
    return errors.ToStatus();
  }
  JobSpec job;
  MapReader top(root, "", &errors, {"apiVersion", "kind", "metadata", "spec"}, {"status"});
  CheckExact(top, "apiVersion", kJobApiVersion);
  CheckExact(top, "kind", kJobKind);
  ParseMetadata(top, &job);
  if (!top.Has("spec")) {
    errors.Add("spec", "required field is missing");
  } else {
    MapReader spec(top.Get("spec"), "spec", &errors,
                   {"image", "servers", "workers", "keyDispatch", "sliceBytes", "priority",
                    "bulking", "compression", "serverMode", "transport", "optimizer", "checkpoint",
                    "recovery", "runPolicy", "scheduler", "monitoring", "tls", "elastic"});
    if (spec.is_mapping()) {
      ParseSpec(spec, &job);
      ParseTlsSpec(spec, &job.tls);
    }
  }
  if (!errors.empty()) return errors.ToStatus();
  return job;
}

}  // namespace

std::string_view ToString(RestartPolicy v) { return NameOf(RestartPolicyNames(), v); }
std::string_view ToString(KeyDispatch v) { return NameOf(KeyDispatchNames(), v); }
std::string_view ToString(CompressionType v) { return NameOf(CompressionTypeNames(), v); }
std::string_view ToString(ServerMode v) { return NameOf(ServerModeNames(), v); }
std::string_view ToString(OptimizerType v) { return NameOf(OptimizerTypeNames(), v); }
std::string_view ToString(CleanPodPolicy v) { return NameOf(CleanPodPolicyNames(), v); }
std::string_view ToString(FailurePolicy v) { return NameOf(FailurePolicyNames(), v); }
std::string_view ToString(Transport v) { return NameOf(TransportNames(), v); }

std::optional<RestartPolicy> ParseRestartPolicy(std::string_view s) {
  return ValueOf(RestartPolicyNames(), s);
}
std::optional<KeyDispatch> ParseKeyDispatch(std::string_view s) {
  return ValueOf(KeyDispatchNames(), s);
}
std::optional<CompressionType> ParseCompressionType(std::string_view s) {
  return ValueOf(CompressionTypeNames(), s);
}
std::optional<ServerMode> ParseServerMode(std::string_view s) {
  return ValueOf(ServerModeNames(), s);
}
std::optional<OptimizerType> ParseOptimizerType(std::string_view s) {
  return ValueOf(OptimizerTypeNames(), s);
}
std::optional<CleanPodPolicy> ParseCleanPodPolicy(std::string_view s) {
  return ValueOf(CleanPodPolicyNames(), s);
}
std::optional<Transport> ParseTransport(std::string_view s) { return ValueOf(TransportNames(), s); }
std::optional<FailurePolicy> ParseFailurePolicy(std::string_view s) {
  return ValueOf(FailurePolicyNames(), s);
}

StatusOr<int64_t> ParseByteQuantity(std::string_view text) {
  size_t digits_end = 0;
  while (digits_end < text.size() && text[digits_end] >= '0' && text[digits_end] <= '9') ++digits_end;
  const std::string_view digits = text.substr(0, digits_end);
  const std::string_view unit = text.substr(digits_end);
  if (digits.empty() || digits.size() > 64 || !(unit.empty() || unit == "Ki" || unit == "Mi" || unit == "Gi")) {
    return InvalidArgumentError("not a byte quantity (digits with an optional Ki, Mi or Gi): " +
                                yaml::Quote(text));
  }
  const int shift = unit == "Ki" ? 10 : unit == "Mi" ? 20 : unit == "Gi" ? 30 : 0;
  int64_t n = 0;
  for (char c : digits) {
    if (n > (kInt64Max - (c - '0')) / 10) return OutOfRangeError("byte quantity too large");
    n = n * 10 + (c - '0');
  }
  if (n > (kInt64Max >> shift)) return OutOfRangeError("byte quantity too large");
  return n << shift;
}

StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text) {
  int documents = 0;
  TRELLIS_ASSIGN_OR_RETURN(YAML::Node root, yaml::LoadFirstDocument(yaml_text, &documents));
  if (documents > 1) {
    return InvalidArgumentError(
        "document: must hold one TrainingJob, got more than one YAML document");
  }
  // Reading the tree does not throw (MapReader asks only what a node's type allows); the
  // catch is the boundary promise, not a code path.
  try {
    return ParseDocument(root);
  } catch (const std::exception& e) {
    return InternalError(std::string("document: unexpected error while reading: ") + e.what());
  }
}

StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  constexpr long kMaxFileBytes = 4 << 20;  // far above any real job; stops reading a wrong file
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return InvalidArgumentError(path + ": is a directory, expected a TrainingJob YAML file");
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    const int err = errno;
    std::string m = path + ": cannot open: " + std::strerror(err);
    if (err == ENOENT) return NotFoundError(std::move(m));
    if (err == EACCES) return PermissionDeniedError(std::move(m));
    return InvalidArgumentError(std::move(m));
  }
  std::string text;
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f.get())) > 0) {
    text.append(buf, n);
    if (text.size() > static_cast<size_t>(kMaxFileBytes)) {
      return InvalidArgumentError(path + ": larger than " + std::to_string(kMaxFileBytes) +
                                  " bytes, not a TrainingJob file");
    }
  }
  if (std::ferror(f.get())) {
    return InvalidArgumentError(path + ": cannot read: " + std::strerror(errno));
  }
  StatusOr<JobSpec> job = ParseJobSpec(text);
  if (job.ok()) return job;
  // Every line names the file, like a compiler's diagnostics.
  std::string m;
  const std::string& msg = job.status().message();
  size_t start = 0;
  while (start <= msg.size()) {
    size_t end = msg.find('\n', start);
    if (end == std::string::npos) end = msg.size();
    if (!m.empty()) m += '\n';
    m += path + ": " + msg.substr(start, end - start);
    start = end + 1;
  }
  return Status(job.status().code(), std::move(m));
}

}  // namespace trellis
