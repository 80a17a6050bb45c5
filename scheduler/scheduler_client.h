// Client of the per-job scheduler, used by the agent, the worker library, the parameter server
// and the launcher. Every call carries the job token and a deadline; a missing scheduler becomes
// DEADLINE_EXCEEDED or UNAVAILABLE, never a hang.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/tls/tls.h"
#include "trellis/v1/scheduler.grpc.pb.h"

namespace trellis {

// The least time between two DNS lookups of the scheduler's name (the channel argument
// GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS): a scheduler pod recreated with a new address is
// found within about this long after the old one went away.
inline constexpr int kSchedulerDnsMinIntervalMs = 1000;
// A channel whose calls have gone unanswered this long (and that is this old) is replaced by a
// fresh one, which resolves the name again at once (see NoteOutcome).
inline constexpr int kSchedulerFreshChannelAfterMs = 1000;
// The least time one connection attempt gets (TCP connect, then the TLS handshake).
inline constexpr int kSchedulerConnectTimeoutMs = 1000;
// The deadline of the periodic calls (Ping, Heartbeat; at most rpc_timeout): a few beats. A
// scheduler pod replaced under its name leaves the old connection without a reset (its address
// is simply gone), so gRPC still calls the channel READY; only the beats' own deadlines tell.
inline constexpr int kSchedulerBeatTimeoutMs = 3000;

// Whether `rank` of `role` is in the world `view` holds now (docs/elastic.md): a server below the
// servers in force, a worker among the members. A view without a world (none yet, or a rank not
// registered: -1) holds every rank. What the agents and trellis-launch ask of an ended program.
bool InTheWorld(const v1::ClusterView& view, v1::Role role, int32_t rank);

// The pod name a takeover of server `rank` registers under (docs/elastic.md#losing-a-server):
// the agent that pod `pod` starts for it, "<pod>+server-<rank>", the pod part cut so that the
// name stays within a registration's 253 characters.
inline std::string TakeOverPodName(const std::string& pod, int32_t rank) {
  const std::string suffix = "+server-" + std::to_string(rank);
  return pod.substr(0, 253 - suffix.size()) + suffix;
}

// The view's entry for server `rank` when another server's pod took it over from pod `lost_pod`
// (NodeInfo.taken_over_by, lost_pod), else nullptr.
inline const v1::NodeInfo* TakenOverFrom(const v1::ClusterView& view, int32_t rank, const std::string& lost_pod) {
  for (const auto& n : view.servers()) {
    if (n.rank() == rank && !n.taken_over_by().empty() && n.lost_pod() == lost_pod) return &n;
  }
  return nullptr;
}

// What a takeover is called in termination messages, status and events: "server 1 (pod j-server-1)
// is lost for good; its shards are taken over by pod j-server-0, which runs it from now on ...".
inline std::string TakeOverMessage(const v1::NodeInfo& n) {
  return "server " + std::to_string(n.rank()) + " (pod " + n.lost_pod() +
         ") is lost for good; its shards are taken over by pod " + n.taken_over_by() +
         ", which runs it from now on (spec.elastic)";
}

struct SchedulerClientOptions {
  std::string address;  // host:port
  std::string token;    // job token; empty when the job runs without one
  std::chrono::milliseconds rpc_timeout{10000};  // deadline of the short calls
  TlsPtr tls;  // mutual TLS (common/tls/tls.h); nullptr: plaintext
};

class SchedulerClient {
 public:
  // Creates the channel; does not wait for the scheduler to be up (the first call does,
  // within its deadline, with wait-for-ready).
  static StatusOr<std::unique_ptr<SchedulerClient>> Connect(const SchedulerClientOptions& options);
  ~SchedulerClient();

  // The job's YAML, as the scheduler holds it (parse with ParseJobSpec).
  StatusOr<std::string> GetJobYaml();
  StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request);
  Status ReportReady(v1::Role role, int32_t rank, const std::string& address);
  // Long poll; see GetClusterRequest. `wait` bounds the poll.
  StatusOr<v1::ClusterView> GetCluster(int64_t after_version, bool wait_complete,
                                       std::chrono::milliseconds wait);
  // Blocks until every worker declared (bounded by `wait`).
  StatusOr<v1::ShardMap> DeclareKeys(int32_t worker_rank, const std::vector<v1::KeySpec>& keys,
                                     std::chrono::milliseconds wait);
  Status Barrier(const std::string& name, v1::Role role, int32_t rank, int64_t generation,
                 bool all_nodes, std::chrono::milliseconds wait);
  StatusOr<v1::HeartbeatResponse> Heartbeat(v1::Role role, int32_t rank, int64_t incarnation,
                                            const std::string& state);
  Status ReportExit(const v1::ReportExitRequest& request);
  Status Leave(v1::Role role, int32_t rank);
  // A local group's bootstrap key: local rank 0 publishes, the others wait for it (bounded by
  // `wait`; DEADLINE_EXCEEDED when nobody published).
  Status PublishGroupKey(const std::string& group, const std::string& key);
  StatusOr<std::string> GetGroupKey(const std::string& group, std::chrono::milliseconds wait);
  // Crash recovery (docs/checkpoints.md#crash-recovery-workers): a restarted worker asks to rejoin
  // (long poll bounded by `wait`); a live worker watches for requests and reports the stash.
  StatusOr<v1::RequestRejoinResponse> RequestRejoin(int32_t rank, int64_t incarnation,
                                                    std::chrono::milliseconds wait);
  enum class WatchMode { kRegister, kPoll, kStop };  // WatchRejoinsRequest: -, wait, stop
  StatusOr<v1::WatchRejoinsResponse> WatchRejoins(int32_t rank, int64_t incarnation,
                                                  WatchMode mode, std::chrono::milliseconds wait);
  Status RejoinServed(const v1::RejoinServedRequest& request);
  // Scheduler restarts (scheduler_watch.h): who serves; a worker hands back its state.
  // With the sender named (role, rank, incarnation), the ping is its program's liveness
  // (docs/scheduler.md#stalls).
  StatusOr<v1::PingResponse> Ping(const v1::PingRequest& request = v1::PingRequest());
  StatusOr<v1::ResumeResponse> Resume(const v1::ResumeRequest& request);
  // Training progress: a worker's batched report; the job's aggregate (operator, launcher).
  Status ReportProgress(const v1::ReportProgressRequest& request);
  StatusOr<v1::JobProgress> GetProgress();
  // The whole job is being stopped from outside (the launcher); rank 0's checkpoints.
  Status StopJob(const std::string& reason);
  Status ReportCheckpoint(const v1::ReportCheckpointRequest& request);
  // An agent whose pod is being stopped from outside: keep the program running? (pod_stops.h)
  StatusOr<v1::PodStoppingResponse> PodStopping(v1::Role role, int32_t rank, int64_t incarnation);
  // Elastic jobs (docs/elastic.md): resize the workers (trellis-launch resize, the operator); a
  // worker's report of the step it reached during a resize (with `wait`, a long poll bounded by
  // `wait_for`).
  // `servers` > 0: resize the servers instead (`workers` 0).
  StatusOr<v1::ResizeResponse> Resize(int32_t workers, const std::string& reason, int32_t servers = 0);
  StatusOr<v1::ReachStepResponse> ReachStep(const v1::ReachStepRequest& request,
                                            std::chrono::milliseconds wait_for);

  // How many channels this client has made (1 + those made after the scheduler went away).
  int channels_made() const EXCLUDES(mu_);

 private:
  SchedulerClient(SchedulerClientOptions options, std::shared_ptr<grpc::Channel> channel);
  static std::shared_ptr<grpc::Channel> MakeChannel(const SchedulerClientOptions& options);
  // The current channel's stub; a call holds its copy, so a channel replaced meanwhile lives on.
  std::shared_ptr<v1::Scheduler::Stub> Stub() const EXCLUDES(mu_);
  // After a call: replaces a channel that has failed for a while (the scheduler moved). `beat`:
  // a periodic call (Ping, Heartbeat), whose deadline counts even on a channel that is READY.
  void NoteOutcome(bool answered, bool beat) EXCLUDES(mu_);
  std::chrono::milliseconds BeatTimeout() const {
    return std::min(options_.rpc_timeout, std::chrono::milliseconds(kSchedulerBeatTimeoutMs));
  }
  // Sets the deadline, token and wait-for-ready on a call.
  void Prepare(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  // Wraps the status with the method's name; notes that the scheduler answered.
  Status Finish(const grpc::Status& st, const char* method);

  SchedulerClientOptions options_;
  mutable Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_ GUARDED_BY(mu_);
  std::shared_ptr<v1::Scheduler::Stub> stub_ GUARDED_BY(mu_);
  std::optional<std::chrono::steady_clock::time_point> failing_since_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point channel_made_ GUARDED_BY(mu_);
  int channels_made_ GUARDED_BY(mu_) = 1;
  // Until the scheduler first answers, calls wait for it to come up (wait-for-ready) instead of
  // failing at once; afterwards a vanished scheduler fails fast with UNAVAILABLE.
  std::atomic<bool> reached_{false};
};

}  // namespace trellis
