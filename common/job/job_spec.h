// The TrainingJob (trellis.io/v1alpha1): the one job format for trellis-launch and the operator.
// Parsing and validation live here and nowhere else; see docs/job-spec.md for the reference.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace trellis {

inline constexpr std::string_view kJobApiVersion = "trellis.io/v1alpha1";
inline constexpr std::string_view kJobKind = "TrainingJob";

enum class RestartPolicy { kNever, kOnFailure, kAlways, kExitCode };
enum class KeyDispatch { kRoundRobin, kHash, kBalanced };
enum class CompressionType { kNone, kTwoBit, kFloat16, kBFloat16 };
enum class ServerMode { kAggregate, kUpdate };
enum class OptimizerType { kSgd, kAdam };
enum class CleanPodPolicy { kNone, kRunning, kAll };
// What a failure that in-job recovery cannot heal does to the job (runPolicy.failurePolicy).
enum class FailurePolicy { kFailJob, kRestartJob };
// The workers' data path to the servers: raw TCP (default; measured at or above 0.75 of a raw
// TCP echo for >= 16 MiB tensors, docs/performance.md) or gRPC streams.
enum class Transport { kTcp, kGrpc };
// Who schedules a job's pods as one gang (operator only): Volcano (scheduling.volcano.sh
// PodGroup) or the coscheduling plugin of kubernetes-sigs/scheduler-plugins
// (scheduling.x-k8s.io PodGroup).
enum class GangScheduler { kVolcano, kSchedulerPlugins };

std::string_view ToString(RestartPolicy v);     // "Never", "OnFailure", "Always", "ExitCode"
std::string_view ToString(KeyDispatch v);       // "roundRobin", "hash", "balanced"
std::string_view ToString(CompressionType v);   // "none", "2bit", "fp16", "bf16"
std::string_view ToString(ServerMode v);        // "aggregate", "update"
std::string_view ToString(OptimizerType v);     // "sgd", "adam"
std::string_view ToString(CleanPodPolicy v);    // "None", "Running", "All"
std::string_view ToString(FailurePolicy v);     // "FailJob", "RestartJob"
std::string_view ToString(Transport v);         // "tcp", "grpc"
std::string_view ToString(GangScheduler v);     // "volcano", "scheduler-plugins"

struct ResourceSpec {
  std::string cpu;     // Kubernetes quantity, e.g. "2" or "500m"; empty: unset
  std::string memory;  // e.g. "4Gi"; empty: unset

  bool operator==(const ResourceSpec&) const = default;
};

struct RoleSpec {
  int32_t replicas = 1;
  // The program the agent starts. Empty for servers means the built-in trellis-pserver.
  std::vector<std::string> command;
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  ResourceSpec requests;
  ResourceSpec limits;
  int32_t gpusPerWorker = 0;                   // workers only
  std::optional<RestartPolicy> restartPolicy;  // unset: spec.runPolicy.restartPolicy
  std::string templateYaml;  // optional pod template, uninterpreted YAML text (quoting kept)

  bool operator==(const RoleSpec&) const = default;
};

struct PrioritySpec {
  bool enabled = true;
  int32_t waterMark = 8;  // slices in flight per worker process

  bool operator==(const PrioritySpec&) const = default;
};

// Small slices travel together in one message (P3-style bulking); bytes are plain integers.
struct BulkingSpec {
  bool enabled = true;
  int64_t thresholdBytes = 64 << 10;  // slices up to this size may share a message
  int64_t pushMaxBytes = 1 << 20;     // per bulk going to a server: headers + payloads
  int32_t pushMaxCount = 64;
  int64_t pullMaxBytes = 1 << 20;     // per bulk of pulls: the bytes they bring back
  int32_t pullMaxCount = 64;

  bool operator==(const BulkingSpec&) const = default;
};
// Bounds: a bulk fits the data path's smallest frame limit (4 MiB, wire::MaxMessageBytes) and
// wire::kMaxBulkEntries.
inline constexpr int64_t kMaxBulkBytes = 4 << 20;
inline constexpr int32_t kMaxBulkCount = 4096;

struct CompressionSpec {
  CompressionType type = CompressionType::kNone;
  double threshold = 0.5;    // 2bit: |residual| >= threshold is sent as +-threshold
  int64_t warmupSteps = 0;   // 2bit starts after this many full-precision steps
  // 2bit: pulls of compressed steps accept the lossless packed answer (aggregate mode; see
  // docs/compression.md). Lossless, so on by default; false: float32 answers as before.
  bool packedPulls = true;

  bool operator==(const CompressionSpec&) const = default;
};

struct OptimizerSpec {
  OptimizerType type = OptimizerType::kSgd;
  double learningRate = 0.01;
  double momentum = 0.0;       // sgd
  double beta1 = 0.9;          // adam
  double beta2 = 0.999;        // adam
  double epsilon = 1e-8;       // adam
  double weightDecay = 0.0;

  bool operator==(const OptimizerSpec&) const = default;
};

struct CheckpointSpec {
  std::string path;            // directory; empty: checkpoints off
  int64_t intervalSteps = 0;   // 0: only on request
  int32_t keep = 3;            // last K checkpoints kept
  // On Kubernetes, the volume that holds `path` (a Kubernetes volume source: persistentVolumeClaim,
  // hostPath, nfs, ...), mounted at `path` in every server and worker pod; uninterpreted YAML
  // text, empty: none (trellis-launch ignores it).
  std::string volumeYaml;

  bool operator==(const CheckpointSpec&) const = default;
};

// Crash recovery of servers (docs/checkpoints.md): each worker keeps its last two pushes per
// slice (host memory: up to 2x the gradients, 1/8 of that with 2-bit) so that a restarted
// server can be rebuilt from replays. Off: a server's death fails the job's operations.
struct RecoverySpec {
  bool retainPushes = true;

  bool operator==(const RecoverySpec&) const = default;
};

// spec.runPolicy.schedulingPolicy (the name Kubeflow's training-operator uses): how the cluster
// schedules the job's pods. Ignored by trellis-launch. Every pod of a Trellis job must run at
// once (the scheduler waits for all), so the gang is always the whole job: no minAvailable.
struct SchedulingPolicySpec {
  std::optional<GangScheduler> gangScheduler;  // unset: no PodGroup, pods scheduled one by one
  std::string schedulerName;  // pods' spec.schedulerName; empty: the gang scheduler's default
  std::string queue;          // Volcano queue (gangScheduler volcano only)
  std::string priorityClass;  // pods' priorityClassName (and the Volcano PodGroup's)
  std::optional<int32_t> scheduleTimeoutSeconds;  // gangScheduler scheduler-plugins only

  bool operator==(const SchedulingPolicySpec&) const = default;
};

struct RunPolicySpec {
  RestartPolicy restartPolicy = RestartPolicy::kOnFailure;
  int32_t backoffLimit = 3;                          // restarts per process before failing
  std::optional<int64_t> activeDeadlineSeconds;
  std::optional<int64_t> ttlSecondsAfterFinished;
  // How long a job stopped from outside may take to stop: the workers' exit checkpoint
  // (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint) and the processes' own exit; on
  // Kubernetes also the pods' terminationGracePeriodSeconds. Unset: kDefaultTerminationGraceSeconds.
  static constexpr int64_t kDefaultTerminationGraceSeconds = 30;
  std::optional<int64_t> terminationGracePeriodSeconds;
  int64_t TerminationGraceSeconds() const {
    return terminationGracePeriodSeconds.value_or(kDefaultTerminationGraceSeconds);
  }
  CleanPodPolicy cleanPodPolicy = CleanPodPolicy::kRunning;
  // A failure in-job recovery cannot heal (the job's scheduler failed the job: every worker
  // lost at once, a server lost without retained pushes, a worker out of restarts): FailJob
  // ends the job Failed; RestartJob stops every process and starts the whole job again, from
  // its newest checkpoint, counted toward backoffLimit (docs/job-spec.md#runpolicy).
  FailurePolicy failurePolicy = FailurePolicy::kFailJob;
  bool suspend = false;
  SchedulingPolicySpec schedulingPolicy;

  bool operator==(const RunPolicySpec&) const = default;
};

struct SchedulerSpec {
  double heartbeatIntervalSeconds = 1.0;
  double heartbeatTimeoutSeconds = 10.0;  // a node silent this long is declared dead
  double registrationTimeoutSeconds = 300.0;
  // Stalls (docs/scheduler.md#stalls): a program whose own pings (every heartbeatIntervalSeconds)
  // stop for this long is stalled and its agent restarts it; 0: off. Unset: 30 s, at least 3
  // heartbeat intervals.
  double livenessTimeoutSeconds = 30.0;
  // A worker whose reported step stands still this long while another worker is ahead of it
  // (waiting for it) is stalled; 0: off.
  double progressTimeoutSeconds = 300.0;

  bool operator==(const SchedulerSpec&) const = default;
};

// spec.elastic (docs/elastic.md): the bounds a running job's workers, and its servers, may be
// resized within. Absent: the job's size is fixed (enabled false). The servers' bounds default
// to spec.servers.replicas (their count fixed).
struct ElasticSpec {
  bool enabled = false;
  int32_t minWorkers = 1;
  int32_t maxWorkers = 1;
  int32_t minServers = 1;
  int32_t maxServers = 1;

  bool operator==(const ElasticSpec&) const = default;
};

// spec.monitoring (docs/job-spec.md#monitoring): how the scheduler judges training progress.
struct StragglerSpec {
  // A worker whose compute time per step stays above `factor` x the median of the workers for
  // `windowSeconds` is the job's straggler (status condition Straggler, metrics, alert).
  double factor = 2.0;
  double windowSeconds = 30.0;

  bool operator==(const StragglerSpec&) const = default;
};

struct MonitoringSpec {
  StragglerSpec straggler;

  bool operator==(const MonitoringSpec&) const = default;
};

// spec.tls (docs/operations.md#tls): mutual TLS between every part of the job, on the scheduler's
// gRPC and on the data path (both transports). Every process presents the same certificate
// (signed by the job's CA, with serverName among its DNS names, usable for server and client
// auth) and accepts only peers whose certificate the CA signed; the job token is still checked.
struct TlsSpec {
  // Operator: a Secret in the job's namespace with ca.crt, tls.crt and tls.key (the layout
  // cert-manager writes), mounted into every pod at kTlsMountDir; the file paths default there.
  std::string secretName;
  std::string caFile;    // PEM CA bundle; set (or secretName set): TLS on
  std::string certFile;  // PEM certificate (chain) this process presents
  std::string keyFile;   // its PEM private key
  std::string serverName = "trellis";  // the name clients check in the server's certificate

  bool enabled() const { return !caFile.empty(); }
  bool operator==(const TlsSpec&) const = default;
};
inline constexpr std::string_view kTlsMountDir = "/etc/trellis/tls";

struct JobSpec {
  // metadata
  std::string name;
  std::string ns = "default";
  std::map<std::string, std::string> labels;

  // spec
  std::string image;
  RoleSpec servers;
  RoleSpec workers;
  KeyDispatch keyDispatch = KeyDispatch::kRoundRobin;
  // 1 MiB: within 90% of the best slice size of a sweep on 1 Gbit/s and on CPU-bound fast links
  // alike (bench_p3; docs/performance.md, "Choosing the slice size"); 4 MiB missed both.
  int64_t sliceBytes = 1 << 20;
  PrioritySpec priority;
  BulkingSpec bulking;
  CompressionSpec compression;
  ServerMode serverMode = ServerMode::kAggregate;
  Transport transport = Transport::kTcp;
  OptimizerSpec optimizer;
  CheckpointSpec checkpoint;
  RecoverySpec recovery;
  RunPolicySpec runPolicy;
  SchedulerSpec scheduler;
  MonitoringSpec monitoring;
  TlsSpec tls;
  ElasticSpec elastic;

  // The worker ranks (slots) the job may ever have: spec.elastic.maxWorkers for an elastic job,
  // else workers.replicas. A grow beyond the first size brings the slots above it in.
  int32_t WorkerSlots() const {
    return elastic.enabled && elastic.maxWorkers > workers.replicas ? elastic.maxWorkers : workers.replicas;
  }

  // The server ranks (slots) the job may ever have: spec.elastic.maxServers for an elastic job,
  // else servers.replicas.
  int32_t ServerSlots() const {
    return elastic.enabled && elastic.maxServers > servers.replicas ? elastic.maxServers : servers.replicas;
  }

  // The effective restart policy of a role (its own, else the run policy's).
  RestartPolicy RestartPolicyFor(const RoleSpec& role) const {
    return role.restartPolicy.value_or(runPolicy.restartPolicy);
  }

  bool operator==(const JobSpec&) const = default;
};

// Parses a whole TrainingJob document (YAML or JSON). On error the Status message lists every
// problem found, one per line, each as "<field path>: <what is wrong>, got <value>" (the
// format is a contract, documented in docs/job-spec.md "Errors"). Never throws.
StatusOr<JobSpec> ParseJobSpec(std::string_view yaml_text);
// Same, reading the file; every line of an error message starts with "<path>: ".
StatusOr<JobSpec> LoadJobSpecFile(const std::string& path);

// Serializes a JobSpec back to a TrainingJob YAML document (defaults filled in). Parsing the
// result gives an equal JobSpec.
std::string JobSpecToYaml(const JobSpec& spec);

// The bounds ParseJobSpec enforces, for callers that take the same settings from flags.
inline constexpr int32_t kMaxReplicas = 10000;
inline constexpr int32_t kMaxGpusPerWorker = 16;
inline constexpr size_t kMaxJobNameLength = 50;  // "<name>-worker-<i>" must fit in 63
inline constexpr int64_t kMinSliceBytes = 4;
inline constexpr int64_t kMaxSliceBytes = int64_t{1} << 30;

// "4194304", "512Ki", "4Mi", "1Gi" -> bytes. Only the range of int64 is checked here.
StatusOr<int64_t> ParseByteQuantity(std::string_view text);

// The inverse of ToString: the exact names only (as in the YAML). nullopt for anything else.
std::optional<RestartPolicy> ParseRestartPolicy(std::string_view s);
std::optional<KeyDispatch> ParseKeyDispatch(std::string_view s);
std::optional<CompressionType> ParseCompressionType(std::string_view s);
std::optional<ServerMode> ParseServerMode(std::string_view s);
std::optional<OptimizerType> ParseOptimizerType(std::string_view s);
std::optional<CleanPodPolicy> ParseCleanPodPolicy(std::string_view s);
std::optional<FailurePolicy> ParseFailurePolicy(std::string_view s);
std::optional<Transport> ParseTransport(std::string_view s);
std::optional<GangScheduler> ParseGangScheduler(std::string_view s);

}  // namespace trellis
