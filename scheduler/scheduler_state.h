// The scheduler's logic without gRPC: the facade the gRPC service calls. It holds the job's
// parts, each an object of its own idea --
//   Membership       (membership.h)       registration and ranks, reports, heartbeats, stalls
//   ShardAssignment  (shard_assignment.h) key declarations -> the shard map
//   Barriers         (barriers.h)         named barriers and their generations
//   GroupKeys        (group_keys.h)       local groups' bootstrap keys
//   Rejoins          (rejoins.h)          restarted workers matched with donors
//   RestartRecovery  (restart_recovery.h) the grace period after a scheduler restart
//   PodStops         (pod_stops.h)        pods stopped from outside: is the whole job?
//   WorldPlan        (world_plan.h)       elastic jobs: the workers taking part, a resize
// -- and what spans them: the cluster view and its waiters, the job's failure, shutdown.
//
// Thread-safe, under ONE lock (mu_): the parts are plain classes, not thread-safe on their own,
// called only with mu_ held (they are GUARDED_BY(mu_)). Calls that may wait (WaitCluster,
// DeclareKeys, Barrier, ...) never block: they take a callback that is called exactly once --
// inline when the answer is known at once, later from whichever call makes the condition true,
// from Sweep() when the deadline passes, or from Shutdown(). Callbacks always run without the
// lock held (deferred.h), so they may call back in. This is what lets the gRPC service keep 1000
// waiting calls without 1000 threads.
//
// Every request is validated here or in the part (role, rank range, registration); nothing a
// peer sends can crash the state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "scheduler/barriers.h"
#include "scheduler/clock.h"
#include "scheduler/deferred.h"
#include "scheduler/group_keys.h"
#include "scheduler/membership.h"
#include "scheduler/pod_stops.h"
#include "scheduler/rejoins.h"
#include "scheduler/restart_recovery.h"
#include "scheduler/scheduler_config.h"
#include "scheduler/shard_assignment.h"
#include "scheduler/world_plan.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class SchedulerState {
 public:
  using TimePoint = Clock::TimePoint;
  template <typename T>
  using Callback = Reply<T>;

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
  // restarted, and this starts or continues its recovery (restart_recovery.h).
  StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& req) EXCLUDES(mu_);
  // Scheduler restarts (restart_recovery.h). Ping: who serves and whether it recovers.
  // Resume: a worker hands back its shard map and the servers' addresses.
  // A ping naming its sender is also that program's liveness (liveness.cc).
  v1::PingResponse Ping(const v1::PingRequest& req = v1::PingRequest()) EXCLUDES(mu_);
  StatusOr<v1::ResumeResponse> Resume(const v1::ResumeRequest& req) EXCLUDES(mu_);
  Status ReportReady(const v1::ReportReadyRequest& req) EXCLUDES(mu_);
  v1::ClusterView GetCluster() const EXCLUDES(mu_);
  // Answers once version > after_version and (if wait_complete) the view is complete or the
  // job failed; at the deadline, answers with the current view.
  void WaitCluster(const v1::GetClusterRequest& req, TimePoint deadline,
                   Callback<std::shared_ptr<const v1::ClusterView>> done) EXCLUDES(mu_);
  // Answers every worker with the same map once all have declared equal keys. A mismatch fails
  // every waiting and later declaration with FAILED_PRECONDITION naming the first differing key.
  // Returns true when the keys equal the first accepted declaration (they may still wait).
  bool DeclareKeys(const v1::DeclareKeysRequest& req, TimePoint deadline,
                   Callback<std::shared_ptr<const v1::ShardMap>> done) EXCLUDES(mu_);
  // A declaration the caller knows equals the first accepted one (the service compared the
  // request bytes with those of an accepted declaration), without parsing 10^4 keys again.
  // REQUIRES: an earlier DeclareKeys returned true.
  void DeclareSameKeys(int32_t worker_rank, TimePoint deadline,
                       Callback<std::shared_ptr<const v1::ShardMap>> done) EXCLUDES(mu_);
  // Releases generation g of barrier `name` once every member arrived at g; an arrival at a
  // generation already released passes at once (a restarted process catching up).
  void Barrier(const v1::BarrierRequest& req, TimePoint deadline,
               Callback<v1::BarrierResponse> done) EXCLUDES(mu_);
  // A local group's bootstrap key (group_keys.h).
  static constexpr size_t kMaxGroupKeyBytes = GroupKeys::kMaxKeyBytes;
  static constexpr size_t kMaxGroupKeys = GroupKeys::kMaxKeys;
  Status PublishGroupKey(const v1::PublishGroupKeyRequest& req) EXCLUDES(mu_);
  void GetGroupKey(const v1::GetGroupKeyRequest& req, TimePoint deadline,
                   Callback<std::string> done) EXCLUDES(mu_);
  // Crash recovery of a worker (rejoins.h).
  void RequestRejoin(const v1::RequestRejoinRequest& req, TimePoint deadline,
                     Callback<v1::RequestRejoinResponse> done) EXCLUDES(mu_);
  void WatchRejoins(const v1::WatchRejoinsRequest& req, TimePoint deadline,
                    Callback<v1::WatchRejoinsResponse> done) EXCLUDES(mu_);
  Status RejoinServed(const v1::RejoinServedRequest& req) EXCLUDES(mu_);
  // A worker program's progress report (ReportProgress): liveness, and its step for the
  // progress check (liveness.cc). Unknown ranks or old incarnations are ignored.
  void ProgramProgress(int32_t rank, int64_t incarnation, int64_t step) EXCLUDES(mu_);
  StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& req) EXCLUDES(mu_);
  Status ReportExit(const v1::ReportExitRequest& req) EXCLUDES(mu_);
  // The whole job is being stopped from outside (StopJob): from now on every Ping answers
  // `stopping`, so the workers stop at their next step boundary after rank 0's exit checkpoint
  // (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint). The first reason stays; empty: not
  // stopping.
  void StopJob(const std::string& reason) EXCLUDES(mu_);
  std::string stop_reason() const EXCLUDES(mu_);
  // A member's pod is being stopped from outside (PodStopping; pod_stops.h): whether its agent
  // keeps the program running for the whole job's exit checkpoint. Once every worker's pod is,
  // the job is stopped as by StopJob. `exit` says what rank 0 did (the ProgressTracker's).
  // Errors: an unknown role, rank or member; a stale incarnation.
  StatusOr<v1::PodStoppingResponse> PodStopping(const v1::PodStoppingRequest& req, bool exit_ready,
                                                bool exit_written) EXCLUDES(mu_);
  // No worker's program has exited for good and the job has not failed: it is not ending by itself.
  bool Training() const EXCLUDES(mu_);
  Status Leave(const v1::LeaveRequest& req) EXCLUDES(mu_);

  // Elastic jobs (scheduler_state_world.cc, world_plan.h). Resize: answered at once; refused
  // while the job stops or ends. ReachStep: a worker's report of the step it reached while a
  // resize is under way; with `wait`, answered once the resize is decided (or, undecided, at the
  // deadline).
  StatusOr<v1::ResizeResponse> Resize(const v1::ResizeRequest& req) EXCLUDES(mu_);
  void ReachStep(const v1::ReachStepRequest& req, TimePoint deadline,
                 Callback<v1::ReachStepResponse> done) EXCLUDES(mu_);
  // The world now, the resize under way (0: none) and its members, the resizes decided (newest
  // last). Null pointers: not wanted.
  v1::WorldInfo World(int64_t* pending_epoch, std::vector<v1::ResizeInfo>* resizes,
                      std::vector<int32_t>* pending_members = nullptr,
                      int32_t* pending_servers = nullptr) const EXCLUDES(mu_);

  // Marks nodes silent for longer than the heartbeat timeout dead (not while recovering after a
  // restart; at the end of the recovery grace, the members still missing), and answers the
  // waiters whose deadline passed. Called periodically (the service's sweeper thread; tests by hand).
  void Sweep() EXCLUDES(mu_);
  // The earliest deadline of any waiter (TimePoint::max() when none).
  TimePoint NextDeadline() const EXCLUDES(mu_);
  // Answers every waiter with UNAVAILABLE and refuses new waits. Idempotent.
  void Shutdown() EXCLUDES(mu_);

  SchedulerStats stats() const EXCLUDES(mu_);

 private:
  struct ClusterWaiter {
    int64_t after_version;
    bool wait_complete;
    TimePoint deadline;
    Callback<std::shared_ptr<const v1::ClusterView>> done;
  };
  struct ReachWaiter {
    int32_t rank;
    int64_t epoch;
    TimePoint deadline;
    Callback<v1::ReachStepResponse> done;
  };

  // OK, or why no call may wait or change the job now: UNAVAILABLE after Shutdown, ABORTED
  // once the job failed (when `failed_counts`).
  Status OpenLocked(bool failed_counts) const REQUIRES(mu_);
  v1::ClusterView ViewLocked() const REQUIRES(mu_);
  // Increments the version and answers the cluster waiters whose condition now holds.
  void ChangedLocked(Deferred* deferred) REQUIRES(mu_);
  // The job failed (the first message stays): every waiting declaration and barrier fails.
  void FailJobLocked(std::string message, Deferred* deferred) REQUIRES(mu_);
  // StopJob with mu_ held (also PodStopping's, once every worker's pod is going).
  void StopJobLocked(const std::string& reason) REQUIRES(mu_);
  bool DeclareLocked(int32_t rank, const ShardAssignment::KeyPtrs* keys, TimePoint deadline,
                     Callback<std::shared_ptr<const v1::ShardMap>> done, Deferred* deferred)
      REQUIRES(mu_);
  // Scheduler restarts (scheduler_state_recovery.cc). Begin: the first sign of a restart opens
  // the grace period. Finish: everyone is back, or the grace is over (the missing are marked
  // dead).
  void BeginRecoveryLocked(const std::string& why) REQUIRES(mu_);
  void MaybeFinishRecoveryLocked(TimePoint now, Deferred* deferred) REQUIRES(mu_);
  StatusOr<int32_t> RegisterLocked(const v1::RegisterRequest& req) REQUIRES(mu_);
  // Answers the cluster waiters past their deadline with the view as it is.
  void SweepClusterWaitersLocked(TimePoint now, Deferred* deferred) REQUIRES(mu_);
  // Elastic jobs (scheduler_state_world.cc): a resize just decided (departed workers, waiters,
  // the view); the ReachStep waiters past their deadline (answered undecided); all of them
  // failed with `st`.
  void WorldDecidedLocked(const v1::WorldInfo& world, Deferred* deferred) REQUIRES(mu_);
  // A resize of the servers (Resize with servers set).
  StatusOr<v1::ResizeResponse> ResizeServersLocked(const v1::ResizeRequest& req) REQUIRES(mu_);
  // The answer to a member that reports for `world`, decided: with the shard map and servers'
  // addresses when it resized the servers.
  v1::ReachStepResponse DecidedAnswerLocked(const v1::WorldInfo& world) const REQUIRES(mu_);
  // A restarted scheduler: the world worker `by` handed back (Resume), when newer than its own.
  Status AdoptWorldLocked(int32_t by, const v1::WorldInfo& world, Deferred* deferred) REQUIRES(mu_);
  // Worker `rank` is gone for good (`why`): an elastic job goes on without it while minWorkers
  // remain (WorldPlan::Lose); otherwise, or below that, the job fails.
  void LoseWorkerLocked(int32_t rank, const std::string& why, Deferred* deferred, bool silent = false) REQUIRES(mu_);
  // Server `rank` is gone for good (`why`): with elastic servers (SchedulerConfig::servers_elastic)
  // a live server's pod takes it over (scheduler_state_takeover.cc); the job fails when none can,
  // or when a takeover of it ended before it served. Returns false when nothing applies (servers
  // not elastic, the job ending or stopping, the rank outside the world): the caller does as before.
  bool TakeOverServerLocked(int32_t rank, const std::string& why, Deferred* deferred) REQUIRES(mu_);
  void SweepReachWaitersLocked(TimePoint now, Deferred* deferred) REQUIRES(mu_);
  void FailReachWaitersLocked(const Status& st, Deferred* deferred) REQUIRES(mu_);
  // Answers (and drops) the ReachStep waiters `which` picks with `answer`.
  void AnswerReachWaitersLocked(const std::function<bool(const ReachWaiter&)>& which,
                                const v1::ReachStepResponse& answer, Deferred* deferred)
      REQUIRES(mu_);

  const SchedulerConfig config_;
  const Clock* const clock_;
  const uint64_t instance_id_;

  mutable Mutex mu_;
  Membership members_ GUARDED_BY(mu_);
  ShardAssignment shards_ GUARDED_BY(mu_);
  Barriers barriers_ GUARDED_BY(mu_);
  GroupKeys group_keys_ GUARDED_BY(mu_);
  Rejoins rejoins_ GUARDED_BY(mu_);
  RestartRecovery recovery_ GUARDED_BY(mu_);
  WorldPlan world_ GUARDED_BY(mu_);
  std::vector<ReachWaiter> reach_waiters_ GUARDED_BY(mu_);
  int64_t resizes_answered_ GUARDED_BY(mu_) = 0;  // the newest epoch WorldDecidedLocked saw
  int64_t workers_lost_ GUARDED_BY(mu_) = 0;      // LoseWorkerLocked: the job went on without them
  int64_t servers_taken_over_ GUARDED_BY(mu_) = 0;  // TakeOverServerLocked: takeovers decided
  // The newest server resize decided: what DecidedAnswerLocked adds for its world.
  struct ServerMove {
    int64_t epoch = 0;
    std::shared_ptr<const v1::ShardMap> map;
    std::vector<std::string> addresses;
  };
  std::optional<ServerMove> server_move_ GUARDED_BY(mu_);

  int64_t version_ GUARDED_BY(mu_) = 1;
  bool was_complete_ GUARDED_BY(mu_) = false;  // for logging the transition once
  bool failed_ GUARDED_BY(mu_) = false;
  std::string failure_message_ GUARDED_BY(mu_);
  bool shutdown_ GUARDED_BY(mu_) = false;
  std::string stop_reason_ GUARDED_BY(mu_);  // StopJob's; empty: not stopping
  TimePoint stop_since_ GUARDED_BY(mu_){};
  PodStops pod_stops_ GUARDED_BY(mu_);
  std::vector<ClusterWaiter> cluster_waiters_ GUARDED_BY(mu_);
};

}  // namespace trellis
