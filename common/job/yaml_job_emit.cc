// JobSpecToYaml (declared in common/job/job_spec.h): the full TrainingJob document, every default
// written out, so `trellis-launch --print-job` and the scheduler's GetJob show what will run.
// User strings are quoted whenever a reader could take them for anything else ("1", "true").
#include <yaml-cpp/yaml.h>

#include "common/job/job_spec.h"
#include "common/job/yaml_emit.h"

namespace trellis {
namespace {

constexpr int64_t kKi = 1024;

void Str(YAML::Emitter& out, std::string_view key, const std::string& value) {
  out << YAML::Key << std::string(key) << YAML::Value;
  yaml::EmitString(out, value);
}

void Plain(YAML::Emitter& out, std::string_view key, std::string_view value) {
  out << YAML::Key << std::string(key) << YAML::Value << std::string(value);
}

void Int(YAML::Emitter& out, std::string_view key, int64_t value) {
  Plain(out, key, std::to_string(value));
}

void Double(YAML::Emitter& out, std::string_view key, double value) {
  Plain(out, key, yaml::FormatDouble(value));
}

void Bool(YAML::Emitter& out, std::string_view key, bool value) {
  Plain(out, key, value ? "true" : "false");
}

void StrList(YAML::Emitter& out, std::string_view key, const std::vector<std::string>& items) {
  out << YAML::Key << std::string(key) << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (const std::string& s : items) yaml::EmitString(out, s);
  out << YAML::EndSeq;
}

// 4194304 -> "4Mi": the unit a person would write, when it divides evenly.
std::string ByteQuantity(int64_t bytes) {
  if (bytes > 0 && bytes % (kKi * kKi * kKi) == 0) return std::to_string(bytes >> 30) + "Gi";
  if (bytes > 0 && bytes % (kKi * kKi) == 0) return std::to_string(bytes >> 20) + "Mi";
  if (bytes > 0 && bytes % kKi == 0) return std::to_string(bytes >> 10) + "Ki";
  return std::to_string(bytes);
}

void Resources(YAML::Emitter& out, std::string_view key, const ResourceSpec& r) {
  out << YAML::Key << std::string(key) << YAML::Value << YAML::BeginMap;
  if (!r.cpu.empty()) Str(out, "cpu", r.cpu);
  if (!r.memory.empty()) Str(out, "memory", r.memory);
  out << YAML::EndMap;
}

void Role(YAML::Emitter& out, std::string_view key, const RoleSpec& role, bool is_workers) {
  out << YAML::Key << std::string(key) << YAML::Value << YAML::BeginMap;
  Int(out, "replicas", role.replicas);
  StrList(out, "command", role.command);
  StrList(out, "args", role.args);
  out << YAML::Key << "env" << YAML::Value << YAML::BeginSeq;
  for (const auto& [name, value] : role.env) {
    out << YAML::BeginMap;
    Str(out, "name", name);
    Str(out, "value", value);
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
  out << YAML::Key << "resources" << YAML::Value << YAML::BeginMap;
  Resources(out, "requests", role.requests);
  Resources(out, "limits", role.limits);
  out << YAML::EndMap;
  if (is_workers) Int(out, "gpusPerWorker", role.gpusPerWorker);
  if (role.restartPolicy) Plain(out, "restartPolicy", ToString(*role.restartPolicy));
  if (!role.templateYaml.empty()) {
    out << YAML::Key << "template" << YAML::Value;
    try {
      yaml::EmitNode(out, YAML::Load(role.templateYaml));
    } catch (const YAML::Exception&) {
      // Not YAML (set by code, not parsed): keep the text so nothing is lost silently.
      out << YAML::DoubleQuoted << role.templateYaml;
    }
  }
  out << YAML::EndMap;
}

}  // namespace

std::string JobSpecToYaml(const JobSpec& spec) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  Plain(out, "apiVersion", kJobApiVersion);
  Plain(out, "kind", kJobKind);
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap;
  Str(out, "name", spec.name);
  Str(out, "namespace", spec.ns);
  if (!spec.labels.empty()) {
    out << YAML::Key << "labels" << YAML::Value << YAML::BeginMap;
    for (const auto& [k, v] : spec.labels) {
      out << YAML::Key;
      yaml::EmitString(out, k);
      out << YAML::Value;
      yaml::EmitString(out, v);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::Key << "spec" << YAML::Value << YAML::BeginMap;
  if (!spec.image.empty()) Str(out, "image", spec.image);
  Role(out, "servers", spec.servers, /*is_workers=*/false);
  Role(out, "workers", spec.workers, /*is_workers=*/true);
  Plain(out, "keyDispatch", ToString(spec.keyDispatch));
  Plain(out, "sliceBytes", ByteQuantity(spec.sliceBytes));

  out << YAML::Key << "priority" << YAML::Value << YAML::BeginMap;
  Bool(out, "enabled", spec.priority.enabled);
  Int(out, "waterMark", spec.priority.waterMark);
  out << YAML::EndMap;

  out << YAML::Key << "bulking" << YAML::Value << YAML::BeginMap;
  Bool(out, "enabled", spec.bulking.enabled);
  Int(out, "thresholdBytes", spec.bulking.thresholdBytes);
  Int(out, "pushMaxBytes", spec.bulking.pushMaxBytes);
  Int(out, "pushMaxCount", spec.bulking.pushMaxCount);
  Int(out, "pullMaxBytes", spec.bulking.pullMaxBytes);
  Int(out, "pullMaxCount", spec.bulking.pullMaxCount);
  out << YAML::EndMap;

  out << YAML::Key << "compression" << YAML::Value << YAML::BeginMap;
  Plain(out, "type", ToString(spec.compression.type));
  Double(out, "threshold", spec.compression.threshold);
  Int(out, "warmupSteps", spec.compression.warmupSteps);
  Bool(out, "packedPulls", spec.compression.packedPulls);
  out << YAML::EndMap;

  Plain(out, "serverMode", ToString(spec.serverMode));
  Plain(out, "transport", ToString(spec.transport));

  const OptimizerSpec& o = spec.optimizer;
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  Plain(out, "type", ToString(o.type));
  Double(out, "learningRate", o.learningRate);
  Double(out, "momentum", o.momentum);
  Double(out, "beta1", o.beta1);
  Double(out, "beta2", o.beta2);
  Double(out, "epsilon", o.epsilon);
  Double(out, "weightDecay", o.weightDecay);
  out << YAML::EndMap;

  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  Str(out, "path", spec.checkpoint.path);
  Int(out, "intervalSteps", spec.checkpoint.intervalSteps);
  Int(out, "keep", spec.checkpoint.keep);
  if (!spec.checkpoint.volumeYaml.empty()) {
    out << YAML::Key << "volume" << YAML::Value;
    try {
      yaml::EmitNode(out, YAML::Load(spec.checkpoint.volumeYaml));
    } catch (const YAML::Exception&) {
      out << YAML::DoubleQuoted << spec.checkpoint.volumeYaml;  // set by code, not parsed
    }
  }
  out << YAML::EndMap;

  out << YAML::Key << "recovery" << YAML::Value << YAML::BeginMap;
  Bool(out, "retainPushes", spec.recovery.retainPushes);
  out << YAML::EndMap;

  const RunPolicySpec& r = spec.runPolicy;
  out << YAML::Key << "runPolicy" << YAML::Value << YAML::BeginMap;
  Plain(out, "restartPolicy", ToString(r.restartPolicy));
  Int(out, "backoffLimit", r.backoffLimit);
  if (r.activeDeadlineSeconds) Int(out, "activeDeadlineSeconds", *r.activeDeadlineSeconds);
  if (r.ttlSecondsAfterFinished) Int(out, "ttlSecondsAfterFinished", *r.ttlSecondsAfterFinished);
  if (r.terminationGracePeriodSeconds) {
    Int(out, "terminationGracePeriodSeconds", *r.terminationGracePeriodSeconds);
  }
  Plain(out, "cleanPodPolicy", ToString(r.cleanPodPolicy));
  // Written only when set: jobs without it keep the document they had.
  if (r.failurePolicy != FailurePolicy::kFailJob) Plain(out, "failurePolicy", ToString(r.failurePolicy));
  Bool(out, "suspend", r.suspend);
  // Written only when set: jobs without it keep the document they had.
  const SchedulingPolicySpec& sp = r.schedulingPolicy;
  if (sp != SchedulingPolicySpec{}) {
    out << YAML::Key << "schedulingPolicy" << YAML::Value << YAML::BeginMap;
    if (sp.gangScheduler) Plain(out, "gangScheduler", ToString(*sp.gangScheduler));
    if (!sp.schedulerName.empty()) Str(out, "schedulerName", sp.schedulerName);
    if (!sp.queue.empty()) Str(out, "queue", sp.queue);
    if (!sp.priorityClass.empty()) Str(out, "priorityClass", sp.priorityClass);
    if (sp.scheduleTimeoutSeconds) Int(out, "scheduleTimeoutSeconds", *sp.scheduleTimeoutSeconds);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  const SchedulerSpec& s = spec.scheduler;
  out << YAML::Key << "scheduler" << YAML::Value << YAML::BeginMap;
  Double(out, "heartbeatIntervalSeconds", s.heartbeatIntervalSeconds);
  Double(out, "heartbeatTimeoutSeconds", s.heartbeatTimeoutSeconds);
  Double(out, "registrationTimeoutSeconds", s.registrationTimeoutSeconds);
  Double(out, "livenessTimeoutSeconds", s.livenessTimeoutSeconds);
  Double(out, "progressTimeoutSeconds", s.progressTimeoutSeconds);
  out << YAML::EndMap;

  if (spec.elastic.enabled) {
    out << YAML::Key << "elastic" << YAML::Value << YAML::BeginMap;
    Int(out, "minWorkers", spec.elastic.minWorkers);
    Int(out, "maxWorkers", spec.elastic.maxWorkers);
    Int(out, "minServers", spec.elastic.minServers);
    Int(out, "maxServers", spec.elastic.maxServers);
    out << YAML::EndMap;
  }

  const StragglerSpec& st = spec.monitoring.straggler;
  out << YAML::Key << "monitoring" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "straggler" << YAML::Value << YAML::BeginMap;
  Double(out, "factor", st.factor);
  Double(out, "windowSeconds", st.windowSeconds);
  out << YAML::EndMap << YAML::EndMap;

  const TlsSpec& tls = spec.tls;
  if (tls.enabled() || !tls.secretName.empty()) {
    out << YAML::Key << "tls" << YAML::Value << YAML::BeginMap;
    if (!tls.secretName.empty()) Str(out, "secretName", tls.secretName);
    Str(out, "caFile", tls.caFile);
    Str(out, "certFile", tls.certFile);
    Str(out, "keyFile", tls.keyFile);
    Str(out, "serverName", tls.serverName);
    out << YAML::EndMap;
  }

  out << YAML::EndMap;  // spec
  out << YAML::EndMap;
  std::string text = out.c_str();
  text += '\n';
  return text;
}

}  // namespace trellis
