// Valid TrainingJob documents: defaults, every field, the JSON the API server sends, the YAML
// round trip, the enum names and file loading.
#include "common/job/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace trellis {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string TestData(const std::string& name) {
  return std::string(TRELLIS_SOURCE_DIR) + "/tests/unit/common/job/testdata/" + name;
}

JobSpec MustParse(std::string_view text) {
  auto job = ParseJobSpec(text);
  EXPECT_TRUE(job.ok()) << job.status().ToString();
  return job.ok() ? *job : JobSpec{};
}

constexpr std::string_view kMinimal = R"(
apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata:
  name: mlp
spec:
  workers:
    command: [./train]
)";

TEST(JobSpecTest, MinimalTakesEveryDefault) {
  JobSpec job = MustParse(kMinimal);
  JobSpec want;
  want.name = "mlp";
  want.workers.command = {"./train"};
  EXPECT_EQ(job, want);
  // The defaults themselves, spelled out: these are the documented values.
  EXPECT_EQ(job.ns, "default");
  EXPECT_EQ(job.servers.replicas, 1);
  EXPECT_TRUE(job.servers.command.empty());
  EXPECT_EQ(job.workers.replicas, 1);
  EXPECT_EQ(job.workers.gpusPerWorker, 0);
  EXPECT_FALSE(job.workers.restartPolicy.has_value());
  EXPECT_EQ(job.keyDispatch, KeyDispatch::kRoundRobin);
  EXPECT_EQ(job.sliceBytes, 1 << 20);
  EXPECT_TRUE(job.priority.enabled);
  EXPECT_EQ(job.priority.waterMark, 8);
  EXPECT_EQ(job.bulking, BulkingSpec{});
  EXPECT_TRUE(job.bulking.enabled);
  EXPECT_EQ(job.compression.type, CompressionType::kNone);
  EXPECT_DOUBLE_EQ(job.compression.threshold, 0.5);
  EXPECT_TRUE(job.compression.packedPulls);  // lossless, so on by default
  EXPECT_EQ(job.serverMode, ServerMode::kAggregate);
  EXPECT_EQ(job.optimizer.type, OptimizerType::kSgd);
  EXPECT_DOUBLE_EQ(job.optimizer.learningRate, 0.01);
  EXPECT_DOUBLE_EQ(job.optimizer.epsilon, 1e-8);
  EXPECT_EQ(job.checkpoint.path, "");
  EXPECT_EQ(job.checkpoint.keep, 3);
  EXPECT_TRUE(job.recovery.retainPushes);
  EXPECT_EQ(job.runPolicy.restartPolicy, RestartPolicy::kOnFailure);
  EXPECT_EQ(job.runPolicy.backoffLimit, 3);
  EXPECT_FALSE(job.runPolicy.activeDeadlineSeconds.has_value());
  EXPECT_FALSE(job.runPolicy.ttlSecondsAfterFinished.has_value());
  EXPECT_FALSE(job.runPolicy.terminationGracePeriodSeconds.has_value());
  EXPECT_EQ(job.runPolicy.TerminationGraceSeconds(), 30);
  EXPECT_EQ(job.runPolicy.cleanPodPolicy, CleanPodPolicy::kRunning);
  EXPECT_EQ(job.runPolicy.failurePolicy, FailurePolicy::kFailJob);
  EXPECT_FALSE(job.runPolicy.suspend);
  EXPECT_DOUBLE_EQ(job.scheduler.heartbeatIntervalSeconds, 1.0);
  EXPECT_DOUBLE_EQ(job.scheduler.heartbeatTimeoutSeconds, 10.0);
  EXPECT_DOUBLE_EQ(job.scheduler.registrationTimeoutSeconds, 300.0);
  EXPECT_DOUBLE_EQ(job.scheduler.livenessTimeoutSeconds, 30.0);
  EXPECT_DOUBLE_EQ(job.scheduler.progressTimeoutSeconds, 300.0);
  EXPECT_EQ(job.RestartPolicyFor(job.workers), RestartPolicy::kOnFailure);
}

TEST(JobSpecTest, FullDocumentSetsEveryField) {
  JobSpec job = MustParse(R"(
apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata: {name: big-job, namespace: ml, labels: {team: a, run: "7"}}
spec:
  image: trellis:0.1
  servers:
    replicas: 3
    command: [/bin/pserver, --fast]
    args: [-v]
    env: [{name: A, value: "1"}, {name: B}]
    resources: {requests: {cpu: 500m, memory: 1Gi}, limits: {cpu: 2, memory: 2Gi}}
    restartPolicy: Always
  workers:
    replicas: 8
    command: [./train]
    args: [--epochs, "3"]
    gpusPerWorker: 2
    restartPolicy: ExitCode
    template:
      spec:
        nodeSelector: {pool: gpu}
  keyDispatch: balanced
  sliceBytes: 512Ki
  priority: {enabled: false, waterMark: 2}
  bulking: {enabled: false, thresholdBytes: 4096, pushMaxBytes: 65536, pushMaxCount: 16,
            pullMaxBytes: 131072, pullMaxCount: 32}
  compression: {type: 2bit, threshold: 0.125, warmupSteps: 50, packedPulls: false}
  serverMode: update
  optimizer: {type: adam, learningRate: 3e-4, momentum: 0.5, beta1: 0.8, beta2: 0.99,
              epsilon: 1e-6, weightDecay: 0.01}
  checkpoint: {path: /ckpt, intervalSteps: 100, keep: 5}
  recovery: {retainPushes: false}
  runPolicy: {restartPolicy: Never, backoffLimit: 0, activeDeadlineSeconds: 3600,
              ttlSecondsAfterFinished: 0, terminationGracePeriodSeconds: 90, cleanPodPolicy: All,
              failurePolicy: RestartJob, suspend: true}
  scheduler: {heartbeatIntervalSeconds: 0.5, heartbeatTimeoutSeconds: 3,
              registrationTimeoutSeconds: 60, livenessTimeoutSeconds: 2,
              progressTimeoutSeconds: 0}
)");
  EXPECT_EQ(job.name, "big-job");
  EXPECT_EQ(job.ns, "ml");
  EXPECT_THAT(job.labels, ElementsAre(Pair("run", "7"), Pair("team", "a")));
  EXPECT_EQ(job.image, "trellis:0.1");
  EXPECT_EQ(job.servers.replicas, 3);
  EXPECT_THAT(job.servers.command, ElementsAre("/bin/pserver", "--fast"));
  EXPECT_THAT(job.servers.args, ElementsAre("-v"));
  EXPECT_THAT(job.servers.env, ElementsAre(Pair("A", "1"), Pair("B", "")));
  EXPECT_EQ(job.servers.requests.cpu, "500m");
  EXPECT_EQ(job.servers.requests.memory, "1Gi");
  EXPECT_EQ(job.servers.limits.cpu, "2");
  EXPECT_EQ(job.servers.limits.memory, "2Gi");
  EXPECT_EQ(job.servers.restartPolicy, RestartPolicy::kAlways);
  EXPECT_EQ(job.workers.replicas, 8);
  EXPECT_THAT(job.workers.args, ElementsAre("--epochs", "3"));
  EXPECT_EQ(job.workers.gpusPerWorker, 2);
  EXPECT_EQ(job.RestartPolicyFor(job.workers), RestartPolicy::kExitCode);
  EXPECT_EQ(job.RestartPolicyFor(job.servers), RestartPolicy::kAlways);
  EXPECT_EQ(job.workers.templateYaml, "spec:\n  nodeSelector:\n    pool: gpu");
  EXPECT_EQ(job.servers.templateYaml, "");
  EXPECT_EQ(job.keyDispatch, KeyDispatch::kBalanced);
  EXPECT_EQ(job.sliceBytes, 512 * 1024);
  EXPECT_FALSE(job.priority.enabled);
  EXPECT_EQ(job.priority.waterMark, 2);
  EXPECT_FALSE(job.bulking.enabled);
  EXPECT_EQ(job.bulking.thresholdBytes, 4096);
  EXPECT_EQ(job.bulking.pushMaxBytes, 65536);
  EXPECT_EQ(job.bulking.pushMaxCount, 16);
  EXPECT_EQ(job.bulking.pullMaxBytes, 131072);
  EXPECT_EQ(job.bulking.pullMaxCount, 32);
  EXPECT_EQ(job.compression.type, CompressionType::kTwoBit);
  EXPECT_DOUBLE_EQ(job.compression.threshold, 0.125);
  EXPECT_EQ(job.compression.warmupSteps, 50);
  EXPECT_FALSE(job.compression.packedPulls);
  EXPECT_EQ(job.serverMode, ServerMode::kUpdate);
  EXPECT_EQ(job.optimizer.type, OptimizerType::kAdam);
  EXPECT_DOUBLE_EQ(job.optimizer.learningRate, 3e-4);
  EXPECT_DOUBLE_EQ(job.optimizer.momentum, 0.5);
  EXPECT_DOUBLE_EQ(job.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(job.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(job.optimizer.epsilon, 1e-6);
  EXPECT_DOUBLE_EQ(job.optimizer.weightDecay, 0.01);
  EXPECT_EQ(job.checkpoint.path, "/ckpt");
  EXPECT_EQ(job.checkpoint.intervalSteps, 100);
  EXPECT_EQ(job.checkpoint.keep, 5);
  EXPECT_FALSE(job.recovery.retainPushes);
  EXPECT_EQ(job.runPolicy.restartPolicy, RestartPolicy::kNever);
  EXPECT_EQ(job.runPolicy.backoffLimit, 0);
  EXPECT_EQ(job.runPolicy.activeDeadlineSeconds, 3600);
  EXPECT_EQ(job.runPolicy.ttlSecondsAfterFinished, 0);
  EXPECT_EQ(job.runPolicy.terminationGracePeriodSeconds, 90);
  EXPECT_EQ(job.runPolicy.TerminationGraceSeconds(), 90);
  EXPECT_EQ(job.runPolicy.cleanPodPolicy, CleanPodPolicy::kAll);
  EXPECT_EQ(job.runPolicy.failurePolicy, FailurePolicy::kRestartJob);
  EXPECT_TRUE(job.runPolicy.suspend);
  EXPECT_DOUBLE_EQ(job.scheduler.heartbeatIntervalSeconds, 0.5);
  EXPECT_DOUBLE_EQ(job.scheduler.heartbeatTimeoutSeconds, 3);
  EXPECT_DOUBLE_EQ(job.scheduler.registrationTimeoutSeconds, 60);
  EXPECT_DOUBLE_EQ(job.scheduler.livenessTimeoutSeconds, 2);
  EXPECT_DOUBLE_EQ(job.scheduler.progressTimeoutSeconds, 0);
}

TEST(JobSpecTest, ApiServerJsonWithMetadataAndStatusParses) {
  JobSpec job = MustParse(ReadFile(TestData("apiserver.json")));
  EXPECT_EQ(job.name, "mlp");
  EXPECT_EQ(job.ns, "team-a");
  EXPECT_THAT(job.labels, ElementsAre(Pair("app", "mlp"), Pair("tier", "1")));
  EXPECT_EQ(job.image, "registry.example.com/trellis:0.1");
  EXPECT_EQ(job.servers.replicas, 2);
  EXPECT_EQ(job.servers.requests.cpu, "1");
  EXPECT_THAT(job.workers.command, ElementsAre("python3", "train.py"));
  EXPECT_THAT(job.workers.env, ElementsAre(Pair("A", "1"), Pair("B", "")));
  EXPECT_EQ(job.workers.gpusPerWorker, 1);
  EXPECT_EQ(job.keyDispatch, KeyDispatch::kHash);
  EXPECT_EQ(job.sliceBytes, 1048576);
  EXPECT_FALSE(job.priority.enabled);
  EXPECT_EQ(job.compression.type, CompressionType::kTwoBit);
  EXPECT_DOUBLE_EQ(job.optimizer.epsilon, 1e-7);
  EXPECT_EQ(job.runPolicy.restartPolicy, RestartPolicy::kExitCode);
  EXPECT_TRUE(job.runPolicy.suspend);
  EXPECT_DOUBLE_EQ(job.scheduler.heartbeatIntervalSeconds, 0.5);
  // JSON strings stay strings in the template: "1" must not turn into the integer 1.
  EXPECT_EQ(job.servers.templateYaml,
            "metadata:\n  labels:\n    x: \"1\"\nspec:\n  priorityClassName: high");
}

TEST(JobSpecTest, RoundTripThroughYamlKeepsEverything) {
  for (const std::string& text :
       {std::string(kMinimal), ReadFile(TestData("apiserver.json")),
        ReadFile(std::string(TRELLIS_SOURCE_DIR) + "/examples/jobs/full.yaml")}) {
    JobSpec job = MustParse(text);
    const std::string yaml = JobSpecToYaml(job);
    auto again = ParseJobSpec(yaml);
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << yaml;
    EXPECT_EQ(*again, job) << yaml;
    EXPECT_EQ(JobSpecToYaml(*again), yaml);  // stable: a second trip prints the same text
  }
}

TEST(JobSpecTest, RoundTripKeepsAwkwardStrings) {
  JobSpec job;
  job.name = "x";
  job.workers.command = {"sh", "-c", "echo \"a: b\" # not a comment"};
  job.workers.args = {"1", "true", "~", "", "null", "0x10", "- dash", "multi\nline"};
  job.workers.env = {{"EMPTY", ""}, {"NUM", "007"}, {"BOOL", "yes"}};
  job.labels = {{"app.kubernetes.io/name", "true"}};
  job.checkpoint.path = "/tmp/with space/#x";
  job.optimizer.learningRate = 0.1 + 0.2;  // not exactly 0.3: needs 17 digits
  job.optimizer.epsilon = 1e-300;
  job.sliceBytes = 4 * 1000;  // no binary unit divides it
  job.runPolicy.activeDeadlineSeconds = 1;
  job.servers.templateYaml = "metadata:\n  annotations:\n    a: \"1\"";
  auto again = ParseJobSpec(JobSpecToYaml(job));
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << JobSpecToYaml(job);
  EXPECT_EQ(*again, job) << JobSpecToYaml(job);
}

TEST(JobSpecTest, ToYamlWritesDefaultsAndFriendlyUnits) {
  JobSpec job = MustParse(kMinimal);
  const std::string yaml = JobSpecToYaml(job);
  EXPECT_THAT(yaml, StartsWith("apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\n"));
  EXPECT_THAT(yaml, HasSubstr("sliceBytes: 1Mi\n"));
  EXPECT_THAT(yaml, HasSubstr("keyDispatch: roundRobin\n"));
  EXPECT_THAT(yaml, HasSubstr("epsilon: 1e-08\n"));
  EXPECT_THAT(yaml, HasSubstr("heartbeatTimeoutSeconds: 10\n"));
  EXPECT_THAT(yaml, HasSubstr("cleanPodPolicy: Running\n"));
  EXPECT_THAT(yaml, Not(HasSubstr("activeDeadlineSeconds")));  // unset stays unset
}

TEST(JobSpecTest, NullMeansUnset) {
  JobSpec job = MustParse(R"(
apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata: {name: j, labels: null}
spec:
  servers: ~
  workers: {command: [a], replicas: null, env: [{name: X, value: null}]}
  checkpoint:
status: {phase: Running}
)");
  EXPECT_EQ(job.workers.replicas, 1);
  EXPECT_THAT(job.workers.env, ElementsAre(Pair("X", "")));
  EXPECT_EQ(job.checkpoint.keep, 3);
}

TEST(JobSpecTest, SliceBytesForms) {
  auto slice = [](std::string_view v) {
    std::string doc = std::string(kMinimal) + "  sliceBytes: " + std::string(v) + "\n";
    auto job = ParseJobSpec(doc);
    return job.ok() ? job->sliceBytes : -1;
  };
  EXPECT_EQ(slice("4"), 4);
  EXPECT_EQ(slice("1048576"), 1 << 20);
  EXPECT_EQ(slice("\"1048576\""), 1 << 20);
  EXPECT_EQ(slice("64Ki"), 64 << 10);
  EXPECT_EQ(slice("8Mi"), 8 << 20);
  EXPECT_EQ(slice("1Gi"), 1 << 30);
  EXPECT_EQ(slice("2Gi"), -1);
  EXPECT_EQ(slice("6"), -1);
  EXPECT_EQ(slice("0"), -1);
}

TEST(JobSpecTest, ParseByteQuantity) {
  EXPECT_EQ(ParseByteQuantity("0").value(), 0);
  EXPECT_EQ(ParseByteQuantity("3Ki").value(), 3072);
  EXPECT_EQ(ParseByteQuantity("8589934591Gi").value(), int64_t{8589934591} << 30);
  EXPECT_EQ(ParseByteQuantity("8589934592Gi").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ParseByteQuantity("99999999999999999999").status().code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ParseByteQuantity("4MB").status().message(),
            "not a byte quantity (digits with an optional Ki, Mi or Gi): \"4MB\"");
  EXPECT_FALSE(ParseByteQuantity("").ok());
  EXPECT_FALSE(ParseByteQuantity("-4").ok());
}

// spec.transport: the workers' data path. Default tcp (docs/performance.md has the figures).
TEST(JobSpecTest, TransportDefaultValuesRoundTripAndErrors) {
  EXPECT_EQ(MustParse(kMinimal).transport, Transport::kTcp);
  EXPECT_THAT(JobSpecToYaml(MustParse(kMinimal)), HasSubstr("transport: tcp\n"));
  for (auto [text, want] : {std::pair{"grpc", Transport::kGrpc}, std::pair{"tcp", Transport::kTcp}}) {
    JobSpec job = MustParse(std::string(kMinimal) + "  transport: " + text + "\n");
    EXPECT_EQ(job.transport, want) << text;
    auto again = ParseJobSpec(JobSpecToYaml(job));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->transport, want) << text;
  }
  EXPECT_EQ(ToString(Transport::kGrpc), "grpc");
  EXPECT_EQ(ParseTransport("tcp"), Transport::kTcp);
  EXPECT_EQ(ParseTransport("udp"), std::nullopt);
  auto bad = ParseJobSpec(std::string(kMinimal) + "  transport: tpc\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(),
              HasSubstr("spec.transport: must be one of tcp, grpc, got \"tpc\""));
}

// spec.elastic (docs/elastic.md): off by default and then not written; the bounds round-trip and
// must hold minWorkers <= replicas <= maxWorkers, each named in its error.
TEST(JobSpecTest, ElasticBoundsDefaultRoundTripAndErrors) {
  EXPECT_FALSE(MustParse(kMinimal).elastic.enabled);
  EXPECT_THAT(JobSpecToYaml(MustParse(kMinimal)), Not(HasSubstr("elastic")));
  const std::string three = std::string(kMinimal) + "    replicas: 3\n";
  JobSpec job = MustParse(three + "  elastic: {minWorkers: 1, maxWorkers: 8}\n");
  EXPECT_TRUE(job.elastic.enabled);
  EXPECT_EQ(job.elastic.minWorkers, 1);
  EXPECT_EQ(job.elastic.maxWorkers, 8);
  auto again = ParseJobSpec(JobSpecToYaml(job));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->elastic, job.elastic);
  const std::pair<std::string, std::string> bad[] = {
      {"{minWorkers: 4, maxWorkers: 8}",
       "spec.elastic.minWorkers: must be <= spec.workers.replicas (3), got 4"},
      {"{minWorkers: 0, maxWorkers: 8}", "spec.elastic.minWorkers: must be >= 1, got 0"},
      {"{minWorkers: 1, maxWorkers: 2}",
       "spec.elastic.maxWorkers: must be >= spec.workers.replicas (3), got 2"},
      {"{minWorkers: 1, maxWorkers: 10001}", "spec.elastic.maxWorkers: must be <= 10000, got 10001"},
      {"{minWorkers: 1}", "spec.elastic.maxWorkers: required field is missing"},
      {"{maxWorkers: 3}", "spec.elastic.minWorkers: required field is missing"},
      {"{minWorkers: 1, maxWorkers: 3, minServers: 0}", "spec.elastic.minServers: must be >= 1, got 0"},
      {"{minWorkers: 1, maxWorkers: 3, minServers: 3}",
       "spec.elastic.minServers: must be <= spec.servers.replicas (1), got 3"},
      {"{minWorkers: 1, maxWorkers: 3, maxServers: 0}",
       "spec.elastic.maxServers: must be >= spec.servers.replicas (1), got 0"},
      {"{minWorkers: 1, maxWorkers: 3, maxServers: 10001}", "spec.elastic.maxServers: must be <= 10000, got 10001"},
      {"{minWorkers: 1, maxWorkers: 3, maxServer: 2}", "spec.elastic.maxServer"},
      {"true", "spec.elastic"},
  };
  for (const auto& [value, message] : bad) {
    auto b = ParseJobSpec(three + "  elastic: " + value + "\n");
    ASSERT_FALSE(b.ok()) << value;
    EXPECT_THAT(b.status().message(), HasSubstr(message)) << value;
  }
  // The servers' bounds default to spec.servers.replicas (their count fixed); set, they
  // round-trip and give the job a server rank (slot) for each server it may grow to.
  EXPECT_EQ(job.elastic.minServers, 1);
  EXPECT_EQ(job.elastic.maxServers, 1);
  EXPECT_EQ(job.ServerSlots(), 1);
  JobSpec servers = MustParse(three + "  servers: {replicas: 2}\n" +
                              "  elastic: {minWorkers: 3, maxWorkers: 3, minServers: 1, maxServers: 4}\n");
  EXPECT_EQ(servers.elastic.minServers, 1);
  EXPECT_EQ(servers.elastic.maxServers, 4);
  EXPECT_EQ(servers.ServerSlots(), 4);
  auto servers_again = ParseJobSpec(JobSpecToYaml(servers));
  ASSERT_TRUE(servers_again.ok()) << servers_again.status().ToString();
  EXPECT_EQ(servers_again->elastic, servers.elastic);
  EXPECT_EQ(MustParse(three + "  servers: {replicas: 2}\n").ServerSlots(), 2) << "not elastic";
  auto gpus = ParseJobSpec(std::string(kMinimal) +
                           "    gpusPerWorker: 2\n  elastic: {minWorkers: 1, maxWorkers: 2}\n");
  ASSERT_FALSE(gpus.ok());
  EXPECT_THAT(gpus.status().message(),
              HasSubstr("spec.elastic: multi-GPU workers (spec.workers.gpusPerWorker 2) cannot "
                        "be resized yet"));
}

// spec.runPolicy.schedulingPolicy: unset by default and then not written; each field round-trips.
TEST(JobSpecTest, SchedulingPolicyDefaultsFieldsAndRoundTrip) {
  EXPECT_EQ(MustParse(kMinimal).runPolicy.schedulingPolicy, SchedulingPolicySpec{});
  EXPECT_THAT(JobSpecToYaml(MustParse(kMinimal)), Not(HasSubstr("schedulingPolicy")));
  JobSpec volcano = MustParse(std::string(kMinimal) +
                              "  runPolicy:\n    schedulingPolicy: {gangScheduler: volcano, queue: research, "
                              "priorityClass: high, schedulerName: my-volcano}\n");
  const SchedulingPolicySpec& v = volcano.runPolicy.schedulingPolicy;
  EXPECT_EQ(v.gangScheduler, GangScheduler::kVolcano);
  EXPECT_EQ(v.queue, "research");
  EXPECT_EQ(v.priorityClass, "high");
  EXPECT_EQ(v.schedulerName, "my-volcano");
  EXPECT_EQ(v.scheduleTimeoutSeconds, std::nullopt);
  JobSpec cosched = MustParse(std::string(kMinimal) +
                              "  runPolicy:\n    schedulingPolicy: {gangScheduler: scheduler-plugins, "
                              "scheduleTimeoutSeconds: 60}\n");
  EXPECT_EQ(cosched.runPolicy.schedulingPolicy.gangScheduler, GangScheduler::kSchedulerPlugins);
  EXPECT_EQ(cosched.runPolicy.schedulingPolicy.scheduleTimeoutSeconds, 60);
  // A priority class alone (no gang) is allowed: it only sets the pods' priorityClassName.
  EXPECT_EQ(MustParse(std::string(kMinimal) + "  runPolicy: {schedulingPolicy: {priorityClass: low}}\n")
                .runPolicy.schedulingPolicy.priorityClass,
            "low");
  for (const JobSpec& job : {volcano, cosched}) {
    auto again = ParseJobSpec(JobSpecToYaml(job));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(*again, job) << JobSpecToYaml(job);
  }
  EXPECT_EQ(ToString(GangScheduler::kSchedulerPlugins), "scheduler-plugins");
  EXPECT_EQ(ParseGangScheduler("volcano"), GangScheduler::kVolcano);
  EXPECT_EQ(ParseGangScheduler("Volcano"), std::nullopt);
}

TEST(JobSpecTest, EnumNamesMatchTheYaml) {
  EXPECT_EQ(ToString(RestartPolicy::kNever), "Never");
  EXPECT_EQ(ToString(RestartPolicy::kOnFailure), "OnFailure");
  EXPECT_EQ(ToString(RestartPolicy::kAlways), "Always");
  EXPECT_EQ(ToString(RestartPolicy::kExitCode), "ExitCode");
  EXPECT_EQ(ToString(KeyDispatch::kRoundRobin), "roundRobin");
  EXPECT_EQ(ToString(KeyDispatch::kHash), "hash");
  EXPECT_EQ(ToString(KeyDispatch::kBalanced), "balanced");
  EXPECT_EQ(ToString(CompressionType::kNone), "none");
  EXPECT_EQ(ToString(CompressionType::kTwoBit), "2bit");
  EXPECT_EQ(ToString(CompressionType::kFloat16), "fp16");
  EXPECT_EQ(ToString(CompressionType::kBFloat16), "bf16");
  EXPECT_EQ(ToString(ServerMode::kAggregate), "aggregate");
  EXPECT_EQ(ToString(ServerMode::kUpdate), "update");
  EXPECT_EQ(ToString(OptimizerType::kSgd), "sgd");
  EXPECT_EQ(ToString(OptimizerType::kAdam), "adam");
  EXPECT_EQ(ToString(CleanPodPolicy::kNone), "None");
  EXPECT_EQ(ToString(CleanPodPolicy::kRunning), "Running");
  EXPECT_EQ(ToString(CleanPodPolicy::kAll), "All");
  EXPECT_EQ(ParseRestartPolicy("ExitCode"), RestartPolicy::kExitCode);
  EXPECT_EQ(ParseRestartPolicy("exitcode"), std::nullopt);
  EXPECT_EQ(ParseKeyDispatch("hash"), KeyDispatch::kHash);
  EXPECT_EQ(ParseCompressionType("2bit"), CompressionType::kTwoBit);
  EXPECT_EQ(ParseCompressionType("bf16"), CompressionType::kBFloat16);
  EXPECT_EQ(ParseServerMode("update"), ServerMode::kUpdate);
  EXPECT_EQ(ParseOptimizerType("adam"), OptimizerType::kAdam);
  EXPECT_EQ(ParseCleanPodPolicy("All"), CleanPodPolicy::kAll);
  EXPECT_EQ(ParseCleanPodPolicy(""), std::nullopt);
  EXPECT_EQ(ToString(FailurePolicy::kRestartJob), "RestartJob");
  EXPECT_EQ(ParseFailurePolicy("FailJob"), FailurePolicy::kFailJob);
  EXPECT_EQ(ParseFailurePolicy("restartjob"), std::nullopt);
}

class LoadJobSpecFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("job_spec_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, std::string_view text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(LoadJobSpecFileTest, LoadsAValidFile) {
  auto job = LoadJobSpecFile(Write("job.yaml", kMinimal));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  EXPECT_EQ(job->name, "mlp");
}

TEST_F(LoadJobSpecFileTest, EveryErrorLineStartsWithThePath) {
  const std::string path = Write("bad.yaml", R"(apiVersion: trellis.io/v1alpha1
kind: TrainingJob
metadata: {name: j}
spec:
  workers: {command: [a], replicas: 0}
  keyDispatch: random
)");
  auto job = LoadJobSpecFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            path + ": spec.workers.replicas: must be >= 1, got 0\n" + path +
                ": spec.keyDispatch: must be one of roundRobin, hash, balanced, got \"random\"");
}

TEST_F(LoadJobSpecFileTest, MalformedYamlNamesFileLineAndColumn) {
  const std::string path = Write("broken.yaml", "apiVersion: trellis.io/v1alpha1\nkind: [a\n");
  auto job = LoadJobSpecFile(path);
  ASSERT_FALSE(job.ok());
  EXPECT_THAT(job.status().message(), StartsWith(path + ": line "));
  EXPECT_THAT(job.status().message(), HasSubstr("malformed YAML"));
}

TEST_F(LoadJobSpecFileTest, MissingFileIsNotFound) {
  const std::string path = (dir_ / "nope.yaml").string();
  auto job = LoadJobSpecFile(path);
  EXPECT_EQ(job.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(job.status().message(), path + ": cannot open: No such file or directory");
}

TEST_F(LoadJobSpecFileTest, DirectoryIsRejected) {
  auto job = LoadJobSpecFile(dir_.string());
  EXPECT_EQ(job.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job.status().message(),
            dir_.string() + ": is a directory, expected a TrainingJob YAML file");
}

TEST_F(LoadJobSpecFileTest, HugeFileIsRejectedWithoutParsing) {
  const std::string path = Write("huge.yaml", std::string(5 << 20, '#'));
  auto job = LoadJobSpecFile(path);
  EXPECT_EQ(job.status().message(),
            path + ": larger than 4194304 bytes, not a TrainingJob file");
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// spec.tls: off by default; files all-or-none; a Secret fills the mounted paths; round trip.
TEST(JobSpecTest, TlsFieldsDefaultsAndErrors) {
  EXPECT_FALSE(MustParse(kMinimal).tls.enabled());
  EXPECT_THAT(JobSpecToYaml(MustParse(kMinimal)), Not(HasSubstr("tls:")));
  JobSpec files = MustParse(std::string(kMinimal) +
                            "  tls: {caFile: /c/ca.pem, certFile: /c/me.pem, keyFile: /c/me.key}\n");
  EXPECT_TRUE(files.tls.enabled());
  EXPECT_EQ(files.tls.keyFile, "/c/me.key");
  EXPECT_EQ(files.tls.serverName, "trellis");
  JobSpec secret = MustParse(std::string(kMinimal) +
                             "  tls: {secretName: job-certs, serverName: mlp.train}\n");
  EXPECT_TRUE(secret.tls.enabled());
  EXPECT_EQ(secret.tls.caFile, "/etc/trellis/tls/ca.crt");
  EXPECT_EQ(secret.tls.certFile, "/etc/trellis/tls/tls.crt");
  EXPECT_EQ(secret.tls.keyFile, "/etc/trellis/tls/tls.key");
  for (const JobSpec& job : {files, secret}) {
    auto again = ParseJobSpec(JobSpecToYaml(job));
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->tls, job.tls);
  }
  auto half = ParseJobSpec(std::string(kMinimal) + "  tls: {caFile: /c/ca.pem}\n");
  ASSERT_FALSE(half.ok());
  EXPECT_THAT(half.status().message(),
              HasSubstr("spec.tls.certFile: required when spec.tls sets any of caFile"));
  EXPECT_THAT(half.status().message(), HasSubstr("spec.tls.keyFile: required"));
  auto name = ParseJobSpec(std::string(kMinimal) + "  tls: {secretName: Bad_Name}\n");
  ASSERT_FALSE(name.ok());
  EXPECT_THAT(name.status().message(), HasSubstr("spec.tls.secretName: must be a Secret name"));
  auto server = ParseJobSpec(std::string(kMinimal) + "  tls: {secretName: s, serverName: a..b}\n");
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("spec.tls.serverName: must be a DNS name"));
  auto unknown = ParseJobSpec(std::string(kMinimal) + "  tls: {caFiles: /x}\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("spec.tls.caFiles"));
}

}  // namespace
}  // namespace trellis
