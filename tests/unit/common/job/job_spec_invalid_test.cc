// Invalid TrainingJob documents, each with the exact message a user (or an operator status
// condition) gets. The format is a contract: see docs/job-spec.md, "Errors".
#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>

#include "common/job/job_spec.h"

namespace trellis {
namespace {

struct InvalidCase {
  const char* name;
  std::string doc;
  std::string message;
};

// A valid job with `spec_body` (indented by two spaces) as its spec.
std::string WithSpec(const std::string& spec_body) {
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: j\nspec:\n" +
         spec_body;
}

// A valid job whose workers have `extra` added (each line indented by four spaces).
std::string WithWorkers(const std::string& extra) {
  return WithSpec("  workers:\n    command: [./train]\n" + extra);
}

std::string Header(const std::string& metadata) {
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: " + metadata +
         "\nspec: {workers: {command: [a]}}\n";
}

std::vector<InvalidCase> Cases() {
  return {
      {"EmptyDocument", "", "document: must be a TrainingJob mapping, got an empty document"},
      {"OnlyComments", "# nothing here\n\n",
       "document: must be a TrainingJob mapping, got an empty document"},
      {"NotAMapping", "- a\n- b\n", "document: must be a TrainingJob mapping, got a sequence"},
      {"PlainScalar", "hello", "document: must be a TrainingJob mapping, got \"hello\""},
      {"TwoDocuments", Header("{name: a}") + "---\n" + Header("{name: b}"),
       "document: must hold one TrainingJob, got more than one YAML document"},
      // yaml-cpp 0.7's LoadAll loops forever (allocating) on these; we must not.
      {"LeadingComma", ",", "line 1, column 1: malformed YAML: unexpected character"},
      {"LeadingCommaBeforeContent", ",apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\n",
       "line 1, column 1: malformed YAML: unexpected character"},
      {"CommaAsSecondDocument", Header("{name: a}") + "---\n,\n",
       "document: must hold one TrainingJob, got more than one YAML document"},
      {"MalformedFlow", "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: [x\n",
       "line 4, column 1: malformed YAML: end of sequence flow not found"},
      {"MalformedIndent", "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\n  metadata: x\n",
       "line 3, column 11: malformed YAML: illegal map value"},
      {"WrongApiVersionAndKind",
       "apiVersion: v1\nkind: Job\nmetadata: {name: j}\nspec: {workers: {command: [a]}}\n",
       "apiVersion: must be \"trellis.io/v1alpha1\", got \"v1\"\n"
       "kind: must be \"TrainingJob\", got \"Job\""},
      {"MissingApiVersionAndKind", "metadata: {name: j}\nspec: {workers: {command: [a]}}\n",
       "apiVersion: required field is missing, expected \"trellis.io/v1alpha1\"\n"
       "kind: required field is missing, expected \"TrainingJob\""},
      {"MissingMetadataName", Header("{namespace: ml}"), "metadata.name: required field is missing"},
      {"MissingMetadata",
       "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nspec: {workers: {command: [a]}}\n",
       "metadata.name: required field is missing"},
      {"NameNotDns", Header("{name: My_Job}"),
       "metadata.name: must be a DNS-1123 label (lower-case letters, digits and '-', starting and "
       "ending with a letter or digit), got \"My_Job\""},
      {"NameTooLong", Header("{name: " + std::string(51, 'a') + "}"),
       "metadata.name: must be at most 50 characters (pod names are <name>-worker-<i>), got \"" +
           std::string(51, 'a') + "\""},
      {"MetadataTypo", Header("{nmae: j}"),
       "metadata.nmae: unknown field; did you mean \"name\"?\n"
       "metadata.name: required field is missing"},
      {"MissingSpec", "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\n",
       "spec: required field is missing"},
      {"TopLevelCase",
       "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\nSpec: {}\n",
       "Spec: unknown field; did you mean \"spec\"?\nspec: required field is missing"},
      {"SpecNotAMapping", WithSpec("  - workers\n"), "spec: must be a mapping, got a sequence"},
      {"UnknownFieldWithSuggestion", WithWorkers("    replica: 2\n"),
       "spec.workers.replica: unknown field; did you mean \"replicas\"?"},
      {"UnknownFieldCaseInsensitive", WithWorkers("  KeyDispatch: hash\n"),
       "spec.KeyDispatch: unknown field; did you mean \"keyDispatch\"?"},
      {"UnknownFieldNoSuggestion", WithWorkers("    flavour: large\n"),
       "spec.workers.flavour: unknown field"},
      {"DuplicateField", WithWorkers("    replicas: 2\n    replicas: 3\n"),
       "spec.workers.replicas: duplicate field"},
      {"StringForInt", WithWorkers("    replicas: \"2\"\n"),
       "spec.workers.replicas: must be an integer, got \"2\""},
      {"FloatForInt", WithWorkers("    replicas: 2.5\n"),
       "spec.workers.replicas: must be an integer, got 2.5"},
      {"BoolForInt", WithWorkers("  priority: {waterMark: true}\n"),
       "spec.priority.waterMark: must be an integer, got true"},
      {"IntegerOverflow", WithWorkers("  compression: {warmupSteps: 99999999999999999999}\n"),
       "spec.compression.warmupSteps: is out of range for a 64-bit integer, got "
       "99999999999999999999"},
      {"NumberForBool", WithWorkers("  runPolicy: {suspend: 1}\n"),
       "spec.runPolicy.suspend: must be true or false, got 1"},
      {"RetainPushesNotBool", WithWorkers("  recovery: {retainPushes: yes please}\n"),
       "spec.recovery.retainPushes: must be true or false, got \"yes please\""},
      {"StringForNumber", WithWorkers("  optimizer: {learningRate: fast}\n"),
       "spec.optimizer.learningRate: must be a number, got \"fast\""},
      {"InfiniteThreshold", WithWorkers("  compression: {type: 2bit, threshold: .inf}\n"),
       "spec.compression.threshold: must be a finite number, got .inf"},
      {"ThresholdBelowFloat32", WithWorkers("  compression: {type: 2bit, threshold: 1e-50}\n"),
       "spec.compression.threshold: must be > 0 and within float32 range, got 1e-50"},
      {"BadEnum", WithWorkers("  keyDispatch: random\n"),
       "spec.keyDispatch: must be one of roundRobin, hash, balanced, got \"random\""},
      {"EnumNearMiss", WithWorkers("  compression: {type: 2Bit}\n"),
       "spec.compression.type: must be one of none, 2bit, fp16, bf16, got \"2Bit\"; did you mean \"2bit\"?"},
      {"BadRestartPolicy", WithWorkers("    restartPolicy: OnError\n"),
       "spec.workers.restartPolicy: must be one of Never, OnFailure, Always, ExitCode, got "
       "\"OnError\""},
      {"EnumOneEditAway", WithWorkers("  serverMode: updte\n"),
       "spec.serverMode: must be one of aggregate, update, got \"updte\"; did you mean \"update\"?"},
      {"BadQuantityString", WithWorkers("  sliceBytes: 4MB\n"),
       "spec.sliceBytes: must be a number of bytes or a quantity such as 512Ki, 4Mi or 1Gi, got "
       "\"4MB\""},
      {"SliceNotMultipleOf4", WithWorkers("  sliceBytes: 1022\n"),
       "spec.sliceBytes: must be a multiple of 4 (whole float32 values), got 1022"},
      {"SliceTooLarge", WithWorkers("  sliceBytes: 2Gi\n"),
       "spec.sliceBytes: must be <= 1Gi (1073741824), got \"2Gi\""},
      {"SliceTooSmall", WithWorkers("  sliceBytes: 0\n"), "spec.sliceBytes: must be >= 4, got 0"},
      {"WorkersCommandMissing", WithSpec("  workers: {replicas: 2}\n"),
       "spec.workers.command: required field is missing"},
      {"WorkersCommandEmpty", WithSpec("  workers: {command: []}\n"),
       "spec.workers.command: must not be empty, got an empty sequence"},
      {"CommandNotASequence", WithSpec("  workers: {command: ./train}\n"),
       "spec.workers.command: must be a sequence of strings, got \"./train\""},
      {"CommandItemNotAString", WithSpec("  workers: {command: [a, {b: c}]}\n"),
       "spec.workers.command[1]: must be a string, got a mapping"},
      {"GpusOnServers", WithWorkers("  servers: {gpusPerWorker: 1}\n"),
       "spec.servers.gpusPerWorker: only allowed under spec.workers, got 1"},
      {"BadCpuQuantity", WithWorkers("    resources: {requests: {cpu: lots}}\n"),
       "spec.workers.resources.requests.cpu: must be a Kubernetes quantity such as 500m, 2 or 4Gi, "
       "got \"lots\""},
      {"EnvProblems", WithWorkers("    env: [{value: x}, {name: A}, {name: A}, [B]]\n"),
       "spec.workers.env[0].name: required field is missing\n"
       "spec.workers.env[2].name: duplicate variable, got \"A\"\n"
       "spec.workers.env[3]: must be a mapping, got a sequence"},
      {"TemplateNotAMapping", WithWorkers("    template: pod.yaml\n"),
       "spec.workers.template: must be a mapping (a pod template), got \"pod.yaml\""},
      {"CheckpointIntervalWithoutPath", WithWorkers("  checkpoint: {intervalSteps: 100}\n"),
       "spec.checkpoint.path: must be set when spec.checkpoint.intervalSteps > 0, got null"},
      {"CheckpointVolumeNotAVolumeSource", WithWorkers("  checkpoint: {path: /ckpt, volume: pvc}\n"),
       "spec.checkpoint.volume: must be a Kubernetes volume source (persistentVolumeClaim, hostPath, ...), got \"pvc\""},
      {"CheckpointVolumeNamed", WithWorkers("  checkpoint: {path: /ckpt, volume: {name: x, emptyDir: {}}}\n"),
       "spec.checkpoint.volume.name: not allowed: the operator names the volume, got \"x\""},
      {"CheckpointVolumeWithoutPath", WithWorkers("  checkpoint: {volume: {emptyDir: {}}}\n"),
       "spec.checkpoint.path: must be set when spec.checkpoint.volume is (where it is mounted), got null"},
      {"HeartbeatTimeoutNotAboveInterval",
       WithWorkers("  scheduler: {heartbeatIntervalSeconds: 5, heartbeatTimeoutSeconds: 5}\n"),
       "spec.scheduler.heartbeatTimeoutSeconds: must be > "
       "spec.scheduler.heartbeatIntervalSeconds (5), got 5"},
      {"HeartbeatIntervalAboveDefaultTimeout",
       WithWorkers("  scheduler: {heartbeatIntervalSeconds: 30}\n"),
       "spec.scheduler.heartbeatTimeoutSeconds: must be > "
       "spec.scheduler.heartbeatIntervalSeconds (30), got 10 (default)"},
      {"LivenessTimeoutNotAboveInterval",
       WithWorkers("  scheduler: {heartbeatIntervalSeconds: 2, livenessTimeoutSeconds: 1,\n"
                   "              progressTimeoutSeconds: -1}\n"),
       "spec.scheduler.livenessTimeoutSeconds: must be 0 (off) or > "
       "spec.scheduler.heartbeatIntervalSeconds (2), got 1\n"
       "spec.scheduler.progressTimeoutSeconds: must be in [0, 86400] (0: off), got -1"},
      {"StragglerFactorNotAboveOne",
       WithWorkers("  monitoring: {straggler: {factor: 1, windowSeconds: 0}}\n"),
       "spec.monitoring.straggler.factor: must be in (1, 1000000], got 1\n"
       "spec.monitoring.straggler.windowSeconds: must be in (0, 86400], got 0"},
      {"MonitoringUnknownField", WithWorkers("  monitoring: {straggler: {windowSecond: 5}}\n"),
       "spec.monitoring.straggler.windowSecond: unknown field; did you mean \"windowSeconds\"?"},
      {"BulkCountAboveLimit", WithWorkers("  bulking: {pushMaxCount: 5000}\n"),
       "spec.bulking.pushMaxCount: must be <= 4096, got 5000"},
      {"BulkBytesAboveFrameLimit", WithWorkers("  bulking: {pullMaxBytes: 8388608}\n"),
       "spec.bulking.pullMaxBytes: must be <= 4194304, got 8388608"},
      {"BulkUnknownField", WithWorkers("  bulking: {maxBytes: 10}\n"),
       "spec.bulking.maxBytes: unknown field"},
      {"DeadlineZero", WithWorkers("  runPolicy: {activeDeadlineSeconds: 0}\n"),
       "spec.runPolicy.activeDeadlineSeconds: must be >= 1, got 0"},
      {"ManyErrorsAtOnce",
       WithSpec("  servers: {replicas: 0}\n"
                "  workers: {replicas: -2, command: [a], gpusPerWorker: 17}\n"
                "  priority: {waterMark: 0}\n"
                "  optimizer: {learningRate: 0, momentum: 1, beta1: -0.1, beta2: 1.5, "
                "epsilon: 0, weightDecay: -1}\n"
                "  checkpoint: {keep: 0, intervalSteps: -1}\n"
                "  runPolicy: {backoffLimit: -1, ttlSecondsAfterFinished: -5, "
                "terminationGracePeriodSeconds: 3601, cleanPodPolicy: Some, failurePolicy: Restart}\n"
                "  scheduler: {heartbeatIntervalSeconds: 0, registrationTimeoutSeconds: -1}\n"),
       "spec.servers.replicas: must be >= 1, got 0\n"
       "spec.workers.replicas: must be >= 1, got -2\n"
       "spec.workers.gpusPerWorker: must be <= 16, got 17\n"
       "spec.priority.waterMark: must be >= 1, got 0\n"
       "spec.optimizer.learningRate: must be > 0, got 0\n"
       "spec.optimizer.momentum: must be in [0, 1), got 1\n"
       "spec.optimizer.beta1: must be in [0, 1), got -0.1\n"
       "spec.optimizer.beta2: must be in [0, 1), got 1.5\n"
       "spec.optimizer.epsilon: must be > 0, got 0\n"
       "spec.optimizer.weightDecay: must be >= 0, got -1\n"
       "spec.checkpoint.intervalSteps: must be >= 0, got -1\n"
       "spec.checkpoint.keep: must be >= 1, got 0\n"
       "spec.runPolicy.backoffLimit: must be >= 0, got -1\n"
       "spec.runPolicy.ttlSecondsAfterFinished: must be >= 0, got -5\n"
       "spec.runPolicy.terminationGracePeriodSeconds: must be <= 3600, got 3601\n"
       "spec.runPolicy.cleanPodPolicy: must be one of None, Running, All, got \"Some\"\n"
       "spec.runPolicy.failurePolicy: must be one of FailJob, RestartJob, got \"Restart\"\n"
       "spec.scheduler.heartbeatIntervalSeconds: must be > 0, got 0\n"
       "spec.scheduler.registrationTimeoutSeconds: must be > 0, got -1"},
      {"TooManyReplicas", WithSpec("  workers: {replicas: 10001, command: [a]}\n"),
       "spec.workers.replicas: must be <= 10000, got 10001"},
      {"GangSchedulerUnknown", WithWorkers("  runPolicy: {schedulingPolicy: {gangScheduler: kube-batch}}\n"),
       "spec.runPolicy.schedulingPolicy.gangScheduler: must be one of volcano, scheduler-plugins, "
       "got \"kube-batch\""},
      {"GangMinAvailableIsNamed",
       WithWorkers("  runPolicy: {schedulingPolicy: {gangScheduler: volcano, minAvailable: 2}}\n"),
       "spec.runPolicy.schedulingPolicy.minAvailable: is not supported: every pod of a Trellis job "
       "must run at once, so the gang is always the whole job (minMember = 1 + servers + workers), "
       "got 2"},
      {"GangQueueWithoutVolcano",
       WithWorkers("  runPolicy: {schedulingPolicy: {gangScheduler: scheduler-plugins, queue: q}}\n"),
       "spec.runPolicy.schedulingPolicy.queue: is a Volcano queue: only allowed with gangScheduler "
       "volcano, got \"q\""},
      {"GangTimeoutWithoutCoscheduling",
       WithWorkers("  runPolicy: {schedulingPolicy: {gangScheduler: volcano, scheduleTimeoutSeconds: 5}}\n"),
       "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: only allowed with gangScheduler "
       "scheduler-plugins, got 5"},
      {"GangTimeoutZero",
       WithWorkers("  runPolicy: {schedulingPolicy: {gangScheduler: scheduler-plugins, "
                   "scheduleTimeoutSeconds: 0}}\n"),
       "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds: must be >= 1, got 0"},
      {"PriorityClassNotAName",
       WithWorkers("  runPolicy: {schedulingPolicy: {priorityClass: High_Prio}}\n"),
       "spec.runPolicy.schedulingPolicy.priorityClass: must be a Kubernetes object name (DNS-1123 "
       "subdomain: lower-case letters, digits, '-' and '.', at most 253 characters), got \"High_Prio\""},
  };
}

// gtest prints the case by name instead of as bytes.
void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class InvalidJobSpecTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidJobSpecTest, GivesTheExactMessage) {
  const InvalidCase& c = GetParam();
  auto job = ParseJobSpec(c.doc);
  ASSERT_FALSE(job.ok()) << "parsed:\n" << c.doc;
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(), c.message) << "document:\n" << c.doc;
}

INSTANTIATE_TEST_SUITE_P(Documents, InvalidJobSpecTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(InvalidJobSpecTest, LongListsAreCutWithACount) {
  std::string workers = "  workers:\n    command: [a]\n";
  for (int i = 0; i < 60; ++i) workers += "    x" + std::to_string(i) + "yz: 1\n";
  auto job = ParseJobSpec(WithSpec(workers));
  ASSERT_FALSE(job.ok());
  const std::string& m = job.status().message();
  EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 50);
  EXPECT_TRUE(m.ends_with("\n... and 10 more errors")) << m;
}

TEST(InvalidJobSpecTest, GarbageNeverThrows) {
  // Odd inputs that have crashed YAML front ends elsewhere: each must come back as a Status.
  const std::string inputs[] = {
      std::string("\0\0\0", 3), "\t\t:", "{{{{{{{{", "*undefined_alias", "&a [*a]",
      std::string(5000, '[') , "!!binary |\n  ====\n", "key: !!int notanint\n",
      "? [complex, key]\n: value\n", "\xff\xfe\x00garbage"};
  for (const std::string& in : inputs) {
    auto job = ParseJobSpec(in);
    EXPECT_FALSE(job.ok()) << in;
  }
}

// std::regex recurses per character: 100 KB where a name, a number or a quantity belongs crashed
// the parser (and the operator reading such a job) with a stack overflow.
TEST(InvalidJobSpecTest, HugeScalarsGetAMessageNotACrash) {
  const std::string huge(160000, '7');
  const std::string letters(160000, 'a');
  auto name = ParseJobSpec(Header("{name: " + letters + "}"));
  ASSERT_FALSE(name.ok());
  EXPECT_TRUE(name.status().message().starts_with("metadata.name: must be at most 50 characters"))
      << name.status().message().substr(0, 200);
  auto ns = ParseJobSpec(Header("{name: j, namespace: " + letters + "}"));
  ASSERT_FALSE(ns.ok());
  EXPECT_TRUE(ns.status().message().starts_with("metadata.namespace: must be a DNS-1123 label"));
  auto replicas = ParseJobSpec(WithWorkers("    replicas: " + huge + "\n"));
  ASSERT_FALSE(replicas.ok());
  EXPECT_TRUE(replicas.status().message().starts_with("spec.workers.replicas: must be an integer"))
      << replicas.status().message().substr(0, 200);
  auto cpu = ParseJobSpec(WithWorkers("    resources: {requests: {cpu: '" + huge + "'}}\n"));
  ASSERT_FALSE(cpu.ok());
  EXPECT_TRUE(cpu.status().message().starts_with("spec.workers.resources.requests.cpu: must be a Kubernetes quantity"));
  auto slice = ParseJobSpec(WithSpec("  workers: {command: [a]}\n  sliceBytes: " + huge + "Ki\n"));
  ASSERT_FALSE(slice.ok());
  // Long strings where any string goes are kept (and written back out quoted).
  auto env = ParseJobSpec(WithWorkers("    env: [{name: BIG, value: " + letters + "}]\n    template: {metadata: {annotations: {a: " +
                                      letters + "}}}\n"));
  ASSERT_TRUE(env.ok()) << env.status().message().substr(0, 200);
  EXPECT_EQ(env->workers.env.at("BIG").size(), letters.size());
  EXPECT_NE(JobSpecToYaml(*env).find(letters), std::string::npos);
}

}  // namespace
}  // namespace trellis
