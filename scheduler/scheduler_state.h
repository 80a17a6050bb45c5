// The scheduler's logic without gRPC: registration and ranks, the cluster view, key
// declaration -> shard map, barriers, heartbeats and dead nodes, exit reports.
//
// Thread-safe. Calls that may wait (WaitCluster, DeclareKeys, Barrier) never block: they take a
// callback that is called exactly once -- inline when the answer is known at once, later from
// whichever call makes the condition true, from Sweep() when the deadline passes, or from
// Shutdown(). Callbacks always run without the state's lock held, so they may call back in.
// This is what lets the gRPC service keep 1000 waiting calls without 1000 threads.
//
// Every request is validated here (role, rank range, registration); nothing a peer sends can
// crash the state.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

struct SchedulerConfig {
  std::string job_name;  // checked against RegisterRequest.job when both are set
  int32_t num_servers = 1;
  int32_t num_workers = 1;
  std::string dispatch = "roundRobin";  // see shard_map.h
  int64_t slice_bytes = 4 << 20;
  std::chrono::milliseconds heartbeat_timeout{10000};
  // After a restart: how long the scheduler waits for the old members to register again before
  // those still missing are marked dead (docs/scheduler.md#scheduler-restart).
  std::chrono::milliseconds recovery_grace{30000};
  uint64_t instance_id = 0;  // PingResponse.scheduler_id; 0: the state picks a random one
  // How long a preempted node's rank waits for its replacement pod to register before the job
  // fails (the job's scheduler.registrationTimeoutSeconds).
  std::chrono::milliseconds replacement_timeout{300000};
  // Stalls (docs/scheduler.md#stalls; spec.scheduler.livenessTimeoutSeconds and
  // progressTimeoutSeconds): a program whose own pings stopped for `liveness_timeout`, or a worker
  // whose reported step stood still for `progress_timeout` while another worker was ahead of it,
  // is stalled and its agent restarts it. 0 turns that check off. A member being restarted must
  // be back within `replacement_timeout`, or the job fails.
  std::chrono::milliseconds liveness_timeout{30000};
  std::chrono::milliseconds progress_timeout{300000};
};

Status ValidateSchedulerConfig(const SchedulerConfig& config);

// "exit code 137 (killed by SIGKILL)", "exit code 1".
std::string DescribeExitCode(int32_t code);

struct SchedulerStats {
  int64_t version = 0;
  int64_t registrations = 0;  // accepted Register calls, re-registrations included
  int64_t restarts = 0;       // all nodes together
  int64_t dead_detected = 0;  // times a node was marked dead
  int64_t waiters = 0;        // calls waiting now
  // Per role, indexed [0] servers, [1] workers (metrics).
  int64_t registered[2] = {0, 0};  // registered now (alive or not)
  int64_t dead[2] = {0, 0};        // marked dead now
  int64_t restarts_of[2] = {0, 0};
  int64_t barrier_releases = 0;        // barrier generations released
  double barrier_wait_seconds = 0;     // summed over every released waiter
  int64_t rejoins = 0;                 // rejoin requests served by a donor
  int64_t fresh_rejoins = 0;           // rejoin requests answered "start fresh"
  int64_t recoveries = 0;              // times this scheduler rebuilt a running job's state
  int64_t stalls = 0;                  // programs found stalled (scheduler_state_stalls.cc)
  bool recovering = false;             // waiting for the old members now
};

class SchedulerState {
 public:
  using TimePoint = Clock::TimePoint;
  template <typename T>
  using Callback = std::function<void(StatusOr<T>)>;

  // REQUIRES: ValidateSchedulerConfig(config).ok(); `clock` outlives the state.
  SchedulerState(SchedulerConfig config, const Clock* clock);
  ~SchedulerState();
  SchedulerState(const SchedulerState&) = delete;
  SchedulerState& operator=(const SchedulerState&) = delete;

  const SchedulerConfig& config() const { return config_; }
  const Clock& clock() const { return *clock_; }
  uint64_t instance_id() const { return instance_id_; }

  // Ranks in arrival order per role; the same pod name gets its old rank and incarnation + 1.
  // More pods of a role than expected: RESOURCE_EXHAUSTED. A pod this scheduler does not know
  // that held a rank before (previous_incarnation > 0) gets that rank back: the scheduler
  // restarted, and this starts or continues its recovery (scheduler_state_recovery.cc).
  StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req);
  // Scheduler restarts (scheduler_state_recovery.cc). Ping: who serves and whether it recovers.
  // Resume: a worker hands back its shard map and the servers' addresses.
  // A ping naming its sender is also that program's liveness (scheduler_state_stalls.cc).
  v1::PingResponse Ping(const v1::PingRequest& req = v1::PingRequest());
  StatusOr<v1::ResumeResponse> Resume(const v1::ResumeRequest& req);
  Status ReportReady(const v1::ReportReadyRequest& req);
  v1::ClusterView GetCluster() const;
  // Answers once version > after_version and (if wait_complete) the view is complete or the
  // job failed; at the deadline, answers with the current view.
  void WaitCluster(const v1::GetClusterRequest& req, TimePoint deadline,
                   Callback<std::shared_ptr<const v1::ClusterView>> done);
  // Answers every worker with the same map once all have declared equal keys. A mismatch fails
  // every waiting and later declaration with FAILED_PRECONDITION naming the first differing key.
  // Returns true when the keys equal the first accepted declaration (they may still wait).
  bool DeclareKeys(const v1::DeclareKeysRequest& req, TimePoint deadline,
                   Callback<std::shared_ptr<const v1::ShardMap>> done);
  // A declaration the caller knows equals the first accepted one (the service compared the
  // request bytes with those of an accepted declaration), without parsing 10^4 keys again.
  // REQUIRES: an earlier DeclareKeys returned true.
  void DeclareSameKeys(int32_t worker_rank, TimePoint deadline,
                       Callback<std::shared_ptr<const v1::ShardMap>> done);
  // Releases generation g of barrier `name` once every member arrived at g; an arrival at a
  // generation already released passes at once (a restarted process catching up).
  void Barrier(const v1::BarrierRequest& req, TimePoint deadline,
               Callback<v1::BarrierResponse> done);
  // A local group's bootstrap key (scheduler_state_group_keys.cc). Publishing overwrites the
  // group's key and answers its waiters; GetGroupKey answers once the key is there, or
  // DEADLINE_EXCEEDED at `deadline`. Names 1..256 characters, keys 1..kMaxGroupKeyBytes; at most
  // kMaxGroupKeys groups, the oldest published one without waiters making room for a new one.
  static constexpr size_t kMaxGroupKeyBytes = 1024;
  static constexpr size_t kMaxGroupKeys = 4096;
  Status PublishGroupKey(const v1::PublishGroupKeyRequest& req);
  void GetGroupKey(const v1::GetGroupKeyRequest& req, TimePoint deadline,
                   Callback<std::string> done);
  // Crash recovery (scheduler_state_rejoin.cc; proto: RequestRejoin, WatchRejoins,
  // RejoinServed). The donor is the lowest-rank live worker watching under its current
  // incarnation, other than the rejoiner; none: answered `fresh` at once. A request waits for
  // its donor's RejoinServed until `deadline` (then DEADLINE_EXCEEDED naming the donor); one
  // request per rank is kept (a newer one fails the older with ABORTED), so the state is
  // bounded by the number of workers.
  void RequestRejoin(const v1::RequestRejoinRequest& req, TimePoint deadline,
                     Callback<v1::RequestRejoinResponse> done);
  void WatchRejoins(const v1::WatchRejoinsRequest& req, TimePoint deadline,
                    Callback<v1::WatchRejoinsResponse> done);
  Status RejoinServed(const v1::RejoinServedRequest& req);
  // A worker program's progress report (ReportProgress): liveness, and its step for the
  // progress check (scheduler_state_stalls.cc). Unknown ranks or old incarnations are ignored.
  void ProgramProgress(int32_t rank, int64_t incarnation, int64_t step);
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req);
  Status ReportExit(const v1::ReportExitRequest& req);
  Status Leave(const v1::LeaveRequest& req);

  // Marks nodes silent for longer than the heartbeat timeout dead (not while recovering after a
  // restart; at the end of the recovery grace, the members still missing), and answers the
  // waiters whose deadline passed. Called periodically (the service's sweeper thread; tests by hand).
  void Sweep();
  // The earliest deadline of any waiter (TimePoint::max() when none).
  TimePoint NextDeadline() const;
  // Answers every waiter with UNAVAILABLE and refuses new waits. Idempotent.
  void Shutdown();

  SchedulerStats stats() const;

 private:
  struct Node {
    bool registered = false;
    std::string pod_name;
    std::string host;
    int32_t gpus = 0;
    std::string address;
    bool ready = false;
    bool dead = false;
    bool exited = false;
    int32_t last_exit_code = 0;
    int64_t incarnation = 0;
    int32_t restarts = 0;
    int32_t program_restarts = 0;   // the part of `restarts` its agents did inside their pods
    bool restart_reported = false;  // ReportExit(will_restart) already counted the next restart
    // Stopped from outside (pod deleted or evicted) under a policy that replaces the pod: the
    // rank waits for the replacement's registration until preempted_at + replacement_timeout.
    bool preempted = false;
    TimePoint preempted_at{};
    TimePoint last_seen{};
    std::string state;  // free-form, from heartbeats
    // Stalls (scheduler_state_stalls.cc). The program's own last ping or progress report in this
    // incarnation; a program that never reported is never judged.
    bool program_reporting = false;
    TimePoint program_seen{};
    int64_t step = -1;       // the last step the program reported (workers); -1: none
    TimePoint step_since{};  // when `step` was first reported
    bool stalled = false;    // its agent is told to restart it (HeartbeatResponse)
    std::string stall_reason;
    bool restarting = false;  // stalled, or exited and restarting; until its program pings again
    TimePoint restarting_since{};
  };
  struct ClusterWaiter {
    int64_t after_version;
    bool wait_complete;
    TimePoint deadline;
    Callback<std::shared_ptr<const v1::ClusterView>> done;
  };
  struct DeclareWaiter {
    int32_t rank;
    TimePoint deadline;
    Callback<std::shared_ptr<const v1::ShardMap>> done;
  };
  struct BarrierWaiter {
    v1::Role role;
    int32_t rank;
    TimePoint arrived;
    TimePoint deadline;
    Callback<v1::BarrierResponse> done;
  };
  struct BarrierGroup {
    bool all_nodes = false;
    int64_t released = 0;  // generations 0..released-1 are released
    std::set<std::pair<int, int32_t>> arrived;  // (role, rank) at generation `released`
    std::vector<BarrierWaiter> waiters;
  };
  struct GroupKeyWaiter {
    TimePoint arrived;
    TimePoint deadline;
    Callback<std::string> done;
  };
  struct GroupKey {
    bool published = false;
    std::string key;
    uint64_t published_seq = 0;  // publication order, for choosing what to evict
    std::vector<GroupKeyWaiter> waiters;
  };
  // A worker's rejoin watcher (index = rank). `incarnation` 0: never watched.
  struct RejoinWatcher {
    int64_t incarnation = 0;
    bool waiting = false;  // a WatchRejoins long poll is parked here
    TimePoint deadline{};
    Callback<v1::WatchRejoinsResponse> done;
    std::vector<uint64_t> queue;  // rejoin ids handed to this donor, not yet polled
  };
  struct Rejoin {
    int32_t rank = 0;
    int64_t incarnation = 0;
    int32_t donor = 0;
    TimePoint arrived{};
    TimePoint deadline{};
    Callback<v1::RequestRejoinResponse> done;
  };
  // Work to do once the lock is released (callbacks).
  using Deferred = std::vector<std::function<void()>>;

  Status CheckNodeLocked(v1::Role role, int32_t rank, bool must_be_registered) const;
  // Recovery after a restart (scheduler_state_recovery.cc). Adopt: a pod unknown here that held
  // `previous_rank` gets it back. Begin: the first sign of a restart opens the grace period.
  // Finish: everyone is back, or the grace is over (the missing are marked dead).
  StatusOr<int32_t> AdoptLocked(const v1::RegisterRequest& req);
  // A new pod when every rank is taken: a rank whose member never came back after a restart
  // (registered, no pod name, dead) is given to it as a restart; -1: none.
  int32_t TakeOrphanLocked(const v1::RegisterRequest& req);
  void BeginRecoveryLocked(const char* why);
  // Stalls (scheduler_state_stalls.cc). Note: the program of `n` reported (a ping or progress
  // under `incarnation`); a restarting node is back then (returns true: the view changed).
  bool NoteProgramLocked(v1::Role role, int32_t rank, int64_t incarnation, TimePoint now);
  // The program's exit was reported (ReportExit): a restart keeps the node restarting.
  void NoteExitLocked(Node& n, bool will_restart, TimePoint now);
  // Marks stalled programs; fails the job when a restart does not come back in time.
  void SweepStallsLocked(TimePoint now, bool* changed, Deferred* deferred);
  void MarkStalledLocked(v1::Role role, int32_t rank, std::string reason, TimePoint now);
  void MaybeFinishRecoveryLocked(TimePoint now, Deferred* deferred);
  Status InstallShardMapLocked(int32_t rank, const v1::ShardMap& map, Deferred* deferred);
  int32_t PreferredFreeRankLocked(v1::Role role, const std::string& pod_name,
                                  int32_t expected) const;
  Node& NodeLocked(v1::Role role, int32_t rank);
  const Node& NodeLocked(v1::Role role, int32_t rank) const;
  bool CompleteLocked() const;
  v1::ClusterView ViewLocked() const;
  void FillNodeLocked(const Node& n, v1::Role role, int32_t rank, v1::NodeInfo* out) const;
  // Increments the version and answers the cluster waiters whose condition now holds.
  void ChangedLocked(Deferred* deferred);
  void FailJobLocked(std::string message, Deferred* deferred);
  void FailDeclarationsLocked(const Status& status, Deferred* deferred);
  std::string KeyMismatchLocked(int32_t rank_a, const std::vector<const v1::KeySpec*>& a,
                                int32_t rank_b, const std::vector<const v1::KeySpec*>& b) const;
  std::string MissingDeclarersLocked() const;
  // Deferred init: `keys` (sorted) differ from the map's keys. Joins or opens the round.
  void ExtendLocked(int32_t rank, const std::vector<const v1::KeySpec*>& keys, TimePoint deadline,
                    Callback<std::shared_ptr<const v1::ShardMap>> done, Deferred* deferred);
  // "key 9 "late", key 10" : the open round's keys that are not in the map (at most 5 named).
  std::string AddedKeysLocked() const;
  void CloseExtensionLocked(const Status& status, Deferred* deferred);
  static void Run(Deferred& deferred);
  // Room for one more group name: evicts the oldest published key without waiters.
  Status MakeGroupKeyRoomLocked();
  // Fails the group-key waiters past their deadline (Sweep).
  void SweepGroupKeysLocked(TimePoint now, Deferred* deferred);
  // The lowest-rank live worker watching under its current incarnation, other than `rejoiner`;
  // -1: none.
  int32_t PickDonorLocked(int32_t rejoiner) const;
  // Hands rejoin `id` to its donor's parked poll, or queues it for the donor's next poll.
  void HandToDonorLocked(uint64_t id, Deferred* deferred);
  // Rejoins past their deadline, watchers' polls to answer empty (Sweep); all (Shutdown).
  void SweepRejoinsLocked(TimePoint now, Deferred* deferred);
  void FailRejoinsLocked(const Status& status, Deferred* deferred);
  TimePoint NextRejoinDeadlineLocked() const;
  size_t RejoinWaitersLocked() const;
  // keys == nullptr: equal to the reference declaration.
  bool DeclareImpl(int32_t rank, const std::vector<const v1::KeySpec*>* keys, TimePoint deadline,
                   Callback<std::shared_ptr<const v1::ShardMap>> done);

  const SchedulerConfig config_;
  const Clock* const clock_;

  mutable std::mutex mu_;
  std::vector<Node> servers_;  // GUARDED_BY(mu_); index = rank
  std::vector<Node> workers_;  // GUARDED_BY(mu_); index = rank
  int32_t registered_servers_ = 0;  // GUARDED_BY(mu_)
  int32_t registered_workers_ = 0;  // GUARDED_BY(mu_)
  std::unordered_map<std::string, std::pair<v1::Role, int32_t>> pods_;  // GUARDED_BY(mu_)
  int64_t version_ = 1;          // GUARDED_BY(mu_)
  bool was_complete_ = false;    // GUARDED_BY(mu_); for logging the transition once
  bool failed_ = false;          // GUARDED_BY(mu_)
  std::string failure_message_;  // GUARDED_BY(mu_)
  bool shutdown_ = false;        // GUARDED_BY(mu_)
  const uint64_t instance_id_;
  // Recovery after a restart: restarted_ once a member showed that the job ran before this
  // scheduler; recovering_ until everyone is back or recovery_deadline_.
  bool restarted_ = false;       // GUARDED_BY(mu_)
  bool recovering_ = false;      // GUARDED_BY(mu_)
  TimePoint recovery_start_{};   // GUARDED_BY(mu_)
  TimePoint recovery_deadline_{};  // GUARDED_BY(mu_)
  SchedulerStats stats_;         // GUARDED_BY(mu_)
  std::vector<ClusterWaiter> cluster_waiters_;  // GUARDED_BY(mu_)

  // Key declaration: the first declaration is the reference every later one must equal.
  std::vector<v1::KeySpec> reference_keys_;  // GUARDED_BY(mu_); sorted by id
  std::vector<const v1::KeySpec*> reference_ptrs_;  // GUARDED_BY(mu_); into reference_keys_
  int32_t reference_rank_ = -1;              // GUARDED_BY(mu_)
  std::set<int32_t> declared_ranks_;         // GUARDED_BY(mu_)
  std::shared_ptr<const v1::ShardMap> shard_map_;  // GUARDED_BY(mu_); built once
  Status keys_error_;                         // GUARDED_BY(mu_); sticky once set
  std::vector<DeclareWaiter> declare_waiters_;  // GUARDED_BY(mu_)

  // Keys declared after the map was built (deferred init), one round at a time: a worker
  // declares all its keys again, the map's plus the new ones. The round's declaration (from its
  // first declarer), who declared it, and who waits. Rounds fail alone; the map is untouched.
  std::vector<v1::KeySpec> ext_keys_;         // GUARDED_BY(mu_); sorted by id
  std::vector<const v1::KeySpec*> ext_ptrs_;  // GUARDED_BY(mu_); into ext_keys_
  int32_t ext_rank_ = -1;                     // GUARDED_BY(mu_); -1: no round open
  std::set<int32_t> ext_ranks_;               // GUARDED_BY(mu_)
  std::vector<DeclareWaiter> ext_waiters_;    // GUARDED_BY(mu_)

  std::map<std::string, BarrierGroup> barriers_;  // GUARDED_BY(mu_)

  std::unordered_map<std::string, GroupKey> group_keys_;  // GUARDED_BY(mu_)
  uint64_t group_key_seq_ = 0;                             // GUARDED_BY(mu_)

  std::vector<RejoinWatcher> rejoin_watchers_;  // GUARDED_BY(mu_); index = worker rank
  std::map<uint64_t, Rejoin> rejoins_;         // GUARDED_BY(mu_); at most one per rank
  uint64_t next_rejoin_id_ = 1;                 // GUARDED_BY(mu_)
};

}  // namespace trellis
