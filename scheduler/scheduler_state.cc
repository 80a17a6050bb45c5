// SchedulerState: the facade over the job's parts -- the members' calls, the cluster view and its
// waiters, the job's failure, the periodic sweep, shutdown and the figures.
#include "scheduler/scheduler_state.h"

#include <algorithm>
#include <random>

#include "common/base/logging.h"

namespace trellis {

SchedulerState::SchedulerState(SchedulerConfig config, const Clock* clock)
    : config_(std::move(config)),
      clock_(clock),
      instance_id_(config_.instance_id != 0 ? config_.instance_id
                                            : (uint64_t{std::random_device()()} << 32 |
                                               std::random_device()()) | 1),
      members_(config_, clock_),
      shards_(config_),
      rejoins_(config_.worker_slots()),
      recovery_(config_),
      world_(config_.num_workers, config_.worker_slots(), config_.elastic, config_.num_servers),
      pod_stops_(config_.server_slots(), config_.worker_slots(), config_.pod_stop_window, config_.stop_limit) {}

SchedulerState::~SchedulerState() { Shutdown(); }

Status SchedulerState::OpenLocked(bool failed_counts) const {
  if (shutdown_) return UnavailableError("scheduler is shutting down");
  if (failed_counts && failed_) return AbortedError("job failed: " + failure_message_);
  return Status::Ok();
}

v1::ClusterView SchedulerState::ViewLocked() const {
  v1::ClusterView v;
  v.set_version(version_);
  v.set_complete(members_.Complete());
  members_.FillView(&v);
  v.set_failed(failed_);
  v.set_failure_message(failure_message_);
  v.set_scheduler_id(instance_id_);
  v.set_recovering(recovery_.recovering());
  *v.mutable_world() = world_.current();
  for (const auto& l : world_.lost()) *v.add_lost_workers() = l;
  return v;
}

void SchedulerState::ChangedLocked(Deferred* deferred) {
  ++version_;
  const bool complete = members_.Complete();
  if (complete && !was_complete_) {
    TLOG_INFO << "cluster complete: " << members_.ServersInForce() << " servers ready, "
              << members_.WorldWorkers() << " workers registered (version " << version_ << ")";
  }
  was_complete_ = complete;
  std::shared_ptr<const v1::ClusterView> view;  // built once, shared by every answered waiter
  // Copies: the analysis cannot see that the predicate runs with mu_ held.
  const int64_t version = version_;
  const bool failed = failed_;
  auto it = std::partition(cluster_waiters_.begin(), cluster_waiters_.end(),
                           [&](const ClusterWaiter& w) {
                             bool ready = version > w.after_version &&
                                          (!w.wait_complete || complete || failed);
                             return !ready;
                           });
  for (auto w = it; w != cluster_waiters_.end(); ++w) {
    if (!view) view = std::make_shared<const v1::ClusterView>(ViewLocked());
    deferred->push_back([done = std::move(w->done), view] { done(view); });
  }
  cluster_waiters_.erase(it, cluster_waiters_.end());
}

void SchedulerState::FailJobLocked(std::string message, Deferred* deferred) {
  if (failed_) return;
  failed_ = true;
  failure_message_ = std::move(message);
  TLOG_ERROR << "job failed: " << failure_message_;
  const Status st = AbortedError("job failed: " + failure_message_);
  shards_.FailAll(st, deferred);
  barriers_.FailAll(st, deferred);
  FailReachWaitersLocked(st, deferred);
}

Status SchedulerState::ReportReady(const v1::ReportReadyRequest& req) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    TRELLIS_RETURN_IF_ERROR(members_.Ready(req));
    // A server grow is announced once every server it adds serves (world_plan.h).
    if (req.role() == v1::ROLE_SERVER && world_.ServerReady(req.rank(), UnixMillisNow())) {
      TLOG_INFO << "the servers added by the resize to " << world_.pending_servers()
                << " servers are ready: world " << world_.pending_epoch()
                << " starts after the step every worker reaches next";
    }
    ChangedLocked(&deferred);
  }
  RunDeferred(deferred);
  return Status::Ok();
}

v1::ClusterView SchedulerState::GetCluster() const {
  MutexLock lock(&mu_);
  return ViewLocked();
}

void SchedulerState::WaitCluster(const v1::GetClusterRequest& req, TimePoint deadline,
                                 Callback<std::shared_ptr<const v1::ClusterView>> done) {
  std::shared_ptr<const v1::ClusterView> view;
  MutexLock lock(&mu_);
  if (shutdown_) {
    lock.Unlock();
    done(UnavailableError("scheduler is shutting down"));
    return;
  }
  const bool ready = version_ > req.after_version() &&
                     (!req.wait_complete() || members_.Complete() || failed_);
  if (ready || deadline <= clock_->Now()) {
    view = std::make_shared<const v1::ClusterView>(ViewLocked());
    lock.Unlock();
    done(std::move(view));
    return;
  }
  cluster_waiters_.push_back({req.after_version(), req.wait_complete(), deadline, std::move(done)});
}

StatusOr<v1::HeartbeatResponse> SchedulerState::Heartbeat(const v1::HeartbeatRequest& req) {
  Deferred deferred;
  v1::HeartbeatResponse resp;
  {
    MutexLock lock(&mu_);
    bool revived = false;
    TRELLIS_RETURN_IF_ERROR(members_.Heartbeat(req, &resp, &revived));
    if (revived) ChangedLocked(&deferred);
    if (req.role() == v1::ROLE_SERVER) {
      for (int32_t r : members_.TakenOverBy(members_.at(req.role(), req.rank()).pod_name)) {
        resp.add_take_over_servers(r);
      }
    }
    resp.set_cluster_version(version_);
    resp.set_job_failed(failed_);
    resp.set_failure_message(failure_message_);
  }
  RunDeferred(deferred);
  return resp;
}

Status SchedulerState::ReportExit(const v1::ReportExitRequest& req) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    std::string failure;
    TRELLIS_RETURN_IF_ERROR(members_.ReportExit(req, &failure));
    // A grow's joiner that ended before it asked to join never was in the job's world: the grow
    // is given up, not the job (world_plan.h).
    if (req.role() == v1::ROLE_WORKER && !req.will_restart() && !req.preempted()) {
      if (std::string why = world_.JoinerExited(req.rank(), DescribeExitCode(req.exit_code())); !why.empty()) {
        TLOG_WARN << why;
        failure.clear();
      }
    }
    // Likewise a server a server grow adds that ended before it was ready (docs/elastic.md#servers).
    // Any other server of the world gone for good is taken over, with elastic servers.
    if (req.role() == v1::ROLE_SERVER && !req.will_restart() && !req.preempted()) {
      if (std::string why = world_.ServerExited(req.rank(), DescribeExitCode(req.exit_code())); !why.empty()) {
        TLOG_WARN << why;
      } else {
        TakeOverServerLocked(req.rank(),
                             "server " + std::to_string(req.rank()) + " (pod " + members_.at(req.role(), req.rank()).pod_name +
                                 ") exited for good: " + DescribeExitCode(req.exit_code()),
                             &deferred);
      }
    }
    if (!failure.empty()) LoseWorkerLocked(req.rank(), failure, &deferred);
    ChangedLocked(&deferred);
  }
  RunDeferred(deferred);
  return Status::Ok();
}

Status SchedulerState::Leave(const v1::LeaveRequest& req) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    TRELLIS_RETURN_IF_ERROR(members_.Leave(req));
    ChangedLocked(&deferred);
  }
  RunDeferred(deferred);
  return Status::Ok();
}

v1::PingResponse SchedulerState::Ping(const v1::PingRequest& req) {
  Deferred deferred;
  v1::PingResponse resp;
  {
    MutexLock lock(&mu_);
    resp.set_scheduler_id(instance_id_);
    resp.set_recovering(recovery_.recovering());
    if (members_.NoteProgram(req.role(), req.rank(), req.incarnation(), clock_->Now())) {
      ChangedLocked(&deferred);
    }
    members_.FillRestarting(&resp);
    resp.set_stopping(!stop_reason_.empty());
    resp.set_resize_epoch(world_.announced_epoch());
    for (const auto& l : world_.lost()) *resp.add_lost_workers() = l;
  }
  RunDeferred(deferred);
  return resp;
}

void SchedulerState::StopJob(const std::string& reason) {
  MutexLock lock(&mu_);
  StopJobLocked(reason);
}

void SchedulerState::StopJobLocked(const std::string& reason) {
  if (!stop_reason_.empty()) return;
  stop_reason_ = reason.empty() ? std::string("stopped from outside") : reason;
  stop_since_ = clock_->Now();
  TLOG_INFO << "the job is being stopped (" << stop_reason_
            << "): workers stop at their next step boundary, rank 0 writes an exit checkpoint";
}

StatusOr<v1::PodStoppingResponse> SchedulerState::PodStopping(const v1::PodStoppingRequest& req, bool exit_ready,
                                                             bool exit_written) {
  MutexLock lock(&mu_);
  TRELLIS_RETURN_IF_ERROR(OpenLocked(/*failed_counts=*/false));
  TRELLIS_RETURN_IF_ERROR(members_.Check(req.role(), req.rank(), /*must_be_registered=*/true));
  const Membership::Member& m = members_.at(req.role(), req.rank());
  if (req.incarnation() != 0 && req.incarnation() < m.incarnation) {
    return FailedPreconditionError("incarnation " + std::to_string(req.incarnation()) + " is not the current one (" +
                                   std::to_string(m.incarnation) + ")");
  }
  const TimePoint now = clock_->Now();
  PodStops::JobState job;
  job.training = !members_.AnyWorkerExited() && !failed_;  // a failed job has nothing to save
  job.stopping = !stop_reason_.empty();
  job.stopping_since = stop_since_;
  job.exit_ready = exit_ready;
  job.exit_written = exit_written;
  const PodStops::Verdict v = pod_stops_.Ask(req.role(), req.rank(), job, now);
  if (v.stop_job) StopJobLocked("every worker's pod is being stopped from outside (deleted, evicted or drained)");
  v1::PodStoppingResponse resp;
  resp.set_wait(v.wait);
  resp.set_reason(v.reason);
  return resp;
}

bool SchedulerState::Training() const {
  MutexLock lock(&mu_);
  return !members_.AnyWorkerExited() && !failed_;
}

std::string SchedulerState::stop_reason() const {
  MutexLock lock(&mu_);
  return stop_reason_;
}

void SchedulerState::ProgramProgress(int32_t rank, int64_t incarnation, int64_t step) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    const TimePoint now = clock_->Now();
    if (members_.NoteProgram(v1::ROLE_WORKER, rank, incarnation, now)) ChangedLocked(&deferred);
    members_.NoteStep(rank, incarnation, step, now);
  }
  RunDeferred(deferred);
}

void SchedulerState::SweepClusterWaitersLocked(TimePoint now, Deferred* deferred) {
  std::shared_ptr<const v1::ClusterView> view;
  auto cit = std::partition(cluster_waiters_.begin(), cluster_waiters_.end(),
                            [&](const ClusterWaiter& w) { return w.deadline > now; });
  for (auto w = cit; w != cluster_waiters_.end(); ++w) {
    if (!view) view = std::make_shared<const v1::ClusterView>(ViewLocked());
    deferred->push_back([done = std::move(w->done), view] { done(view); });
  }
  cluster_waiters_.erase(cit, cluster_waiters_.end());
}

void SchedulerState::Sweep() {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    const TimePoint now = clock_->Now();
    MaybeFinishRecoveryLocked(now, &deferred);
    // Nobody is declared dead or stalled while the members of a running job come back to a
    // restarted scheduler: the grace period's end starts everyone's heartbeat timeout afresh.
    if (!recovery_.recovering()) {
      bool changed = false;
      std::vector<Membership::Loss> losses;
      members_.SweepLiveness(now, &changed, &losses);
      for (auto& loss : losses) {
        if (loss.role == v1::ROLE_WORKER) {
          LoseWorkerLocked(loss.rank, loss.why, &deferred, loss.silent);
        } else if (!TakeOverServerLocked(loss.rank, loss.why, &deferred)) {
          FailJobLocked(std::move(loss.why), &deferred);
        }
      }
      if (changed) ChangedLocked(&deferred);
    }
    // Waiters past their deadline: GetCluster answers with the view as it is, the others fail.
    SweepClusterWaitersLocked(now, &deferred);
    shards_.Sweep(now, &deferred);
    barriers_.Sweep(now, members_, &deferred);
    group_keys_.Sweep(now, &deferred);
    rejoins_.Sweep(now, &deferred);
    SweepReachWaitersLocked(now, &deferred);
    if (std::string why = world_.AbandonUnreported(UnixMillisNow(), WorldPlan::kUnreportedLimitMs);
        !why.empty()) {
      TLOG_WARN << why;
    }
  }
  RunDeferred(deferred);
}

SchedulerState::TimePoint SchedulerState::NextDeadline() const {
  MutexLock lock(&mu_);
  TimePoint next = TimePoint::max();
  for (const auto& w : cluster_waiters_) next = std::min(next, w.deadline);
  next = std::min(next, shards_.NextDeadline());
  next = std::min(next, barriers_.NextDeadline());
  next = std::min(next, group_keys_.NextDeadline());
  for (const auto& w : reach_waiters_) next = std::min(next, w.deadline);
  return std::min(next, rejoins_.NextDeadline());
}

void SchedulerState::Shutdown() {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    const Status st = UnavailableError("scheduler is shutting down");
    for (auto& w : cluster_waiters_) deferred.push_back([done = std::move(w.done), st] { done(st); });
    cluster_waiters_.clear();
    shards_.FailAll(st, &deferred);
    barriers_.FailAll(st, &deferred);
    group_keys_.FailAll(st, &deferred);
    rejoins_.FailAll(st, &deferred);
    FailReachWaitersLocked(st, &deferred);
  }
  RunDeferred(deferred);
}

SchedulerStats SchedulerState::stats() const {
  MutexLock lock(&mu_);
  SchedulerStats s;
  s.version = version_;
  s.waiters = static_cast<int64_t>(cluster_waiters_.size() + shards_.waiters() +
                                   barriers_.waiters() + group_keys_.waiters() +
                                   rejoins_.waiters() + reach_waiters_.size());
  members_.AddTo(&s);
  s.resizes = resizes_answered_;
  s.workers_lost = workers_lost_;
  s.servers_taken_over = servers_taken_over_;
  s.world_workers = world_.size();
  s.world_servers = world_.servers();
  barriers_.AddTo(&s);
  rejoins_.AddTo(&s);
  recovery_.AddTo(&s);
  return s;
}

}  // namespace trellis
