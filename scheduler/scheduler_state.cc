#include "scheduler/scheduler_state.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <sstream>

#include "common/base/logging.h"
#include "scheduler/shard_map.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

namespace {

const char* SignalName(int sig) {
  switch (sig) {
    case 1: return "SIGHUP";
    case 2: return "SIGINT";
    case 3: return "SIGQUIT";
    case 4: return "SIGILL";
    case 6: return "SIGABRT";
    case 7: return "SIGBUS";
    case 8: return "SIGFPE";
    case 9: return "SIGKILL";
    case 11: return "SIGSEGV";
    case 13: return "SIGPIPE";
    case 15: return "SIGTERM";
    default: return nullptr;
  }
}

}  // namespace


Status ValidateSchedulerConfig(const SchedulerConfig& config) {
  if (config.num_servers < 1) {
    return InvalidArgumentError("number of servers must be >= 1, got " +
                                std::to_string(config.num_servers));
  }
  if (config.num_workers < 1) {
    return InvalidArgumentError("number of workers must be >= 1, got " +
                                std::to_string(config.num_workers));
  }
  if (config.replacement_timeout.count() <= 0) {
    return InvalidArgumentError("replacement timeout must be > 0, got " +
                                std::to_string(config.replacement_timeout.count()) + " ms");
  }
  if (config.heartbeat_timeout.count() <= 0) {
    return InvalidArgumentError("heartbeat timeout must be > 0, got " +
                                std::to_string(config.heartbeat_timeout.count()) + " ms");
  }
  return ValidateShardSettings(config.dispatch, config.num_servers, config.slice_bytes);
}

std::string DescribeExitCode(int32_t code) {
  std::string s = "exit code " + std::to_string(code);
  if (code > 128 && code < 128 + 65) {
    const char* name = SignalName(code - 128);
    s += name != nullptr ? std::string(" (killed by ") + name + ")"
                         : " (killed by signal " + std::to_string(code - 128) + ")";
  }
  return s;
}

SchedulerState::SchedulerState(SchedulerConfig config, const Clock* clock)
    : config_(std::move(config)),
      clock_(clock),
      instance_id_(config_.instance_id != 0 ? config_.instance_id
                                            : (uint64_t{std::random_device()()} << 32 |
                                               std::random_device()()) | 1) {
  servers_.resize(static_cast<size_t>(config_.num_servers));
  workers_.resize(static_cast<size_t>(config_.num_workers));
  rejoin_watchers_.resize(static_cast<size_t>(config_.num_workers));
}

SchedulerState::~SchedulerState() { Shutdown(); }

void SchedulerState::Run(Deferred& deferred) {
  for (auto& f : deferred) f();
  deferred.clear();
}

Status SchedulerState::CheckNodeLocked(v1::Role role, int32_t rank, bool must_be_registered) const {
  if (!KnownRole(role)) {
    return InvalidArgumentError("role must be ROLE_SERVER or ROLE_WORKER, got " +
                                std::to_string(static_cast<int>(role)));
  }
  const int32_t n = role == v1::ROLE_SERVER ? config_.num_servers : config_.num_workers;
  if (rank < 0 || rank >= n) {
    return InvalidArgumentError(std::string(RoleName(role)) + " rank must be in [0, " +
                                std::to_string(n) + "), got " + std::to_string(rank));
  }
  if (must_be_registered && !NodeLocked(role, rank).registered) {
    // NOT_FOUND: after a scheduler restart, the caller registers (resumes) again.
    return NotFoundError(std::string(RoleName(role)) + " " + std::to_string(rank) +
                                   " has not registered");
  }
  return Status::Ok();
}

// Pods named like a StatefulSet or the launcher names them ("<job>-worker-<i>") get rank i, so
// ranks follow pod names and do not depend on who registers first; any other name, or an
// ordinal that is out of range or taken, gets the lowest free rank.
int32_t SchedulerState::PreferredFreeRankLocked(v1::Role role, const std::string& pod_name,
                                                int32_t expected) const {
  size_t digits = 0;
  while (digits < pod_name.size() && digits < 9 &&
         std::isdigit(static_cast<unsigned char>(pod_name[pod_name.size() - 1 - digits]))) {
    ++digits;
  }
  if (digits > 0 && digits < pod_name.size() && pod_name[pod_name.size() - 1 - digits] == '-') {
    const int32_t ordinal = std::stoi(pod_name.substr(pod_name.size() - digits));
    if (ordinal < expected && !NodeLocked(role, ordinal).registered) return ordinal;
  }
  for (int32_t r = 0; r < expected; ++r) {
    if (!NodeLocked(role, r).registered) return r;
  }
  return expected;  // not reached: the caller checked that a rank is free
}

SchedulerState::Node& SchedulerState::NodeLocked(v1::Role role, int32_t rank) {
  return role == v1::ROLE_SERVER ? servers_[static_cast<size_t>(rank)]
                                 : workers_[static_cast<size_t>(rank)];
}

const SchedulerState::Node& SchedulerState::NodeLocked(v1::Role role, int32_t rank) const {
  return role == v1::ROLE_SERVER ? servers_[static_cast<size_t>(rank)]
                                 : workers_[static_cast<size_t>(rank)];
}

bool SchedulerState::CompleteLocked() const {
  if (registered_servers_ < config_.num_servers || registered_workers_ < config_.num_workers) {
    return false;
  }
  return std::all_of(servers_.begin(), servers_.end(), [](const Node& n) { return n.ready; });
}

void SchedulerState::FillNodeLocked(const Node& n, v1::Role role, int32_t rank,
                                    v1::NodeInfo* out) const {
  out->set_role(role);
  out->set_rank(rank);
  out->set_pod_name(n.pod_name);
  out->set_host(n.host);
  out->set_address(n.address);
  out->set_ready(n.ready);
  out->set_dead(n.dead);
  out->set_exited(n.exited);
  out->set_last_exit_code(n.last_exit_code);
  out->set_incarnation(n.incarnation);
  out->set_restarts(n.restarts);
  out->set_program_restarts(n.program_restarts);
  out->set_gpus(n.gpus);
  out->set_preempted(n.preempted);
  out->set_stalled(n.stalled);
  out->set_stall_reason(n.stall_reason);
  out->set_restarting(n.restarting);
}

v1::ClusterView SchedulerState::ViewLocked() const {
  v1::ClusterView v;
  v.set_version(version_);
  v.set_complete(CompleteLocked());
  v.set_num_servers(config_.num_servers);
  v.set_num_workers(config_.num_workers);
  v.mutable_servers()->Reserve(config_.num_servers);
  for (int32_t r = 0; r < config_.num_servers; ++r) {
    FillNodeLocked(servers_[static_cast<size_t>(r)], v1::ROLE_SERVER, r, v.add_servers());
  }
  v.mutable_workers()->Reserve(config_.num_workers);
  for (int32_t r = 0; r < config_.num_workers; ++r) {
    FillNodeLocked(workers_[static_cast<size_t>(r)], v1::ROLE_WORKER, r, v.add_workers());
  }
  v.set_failed(failed_);
  v.set_failure_message(failure_message_);
  v.set_scheduler_id(instance_id_);
  v.set_recovering(recovering_);
  return v;
}

void SchedulerState::ChangedLocked(Deferred* deferred) {
  ++version_;
  const bool complete = CompleteLocked();
  if (complete && !was_complete_) {
    TLOG_INFO << "cluster complete: " << config_.num_servers << " servers ready, "
              << config_.num_workers << " workers registered (version " << version_ << ")";
  }
  was_complete_ = complete;
  std::shared_ptr<const v1::ClusterView> view;  // built once, shared by every answered waiter
  auto it = std::partition(cluster_waiters_.begin(), cluster_waiters_.end(),
                           [&](const ClusterWaiter& w) {
                             bool ready = version_ > w.after_version &&
                                          (!w.wait_complete || complete || failed_);
                             return !ready;
                           });
  for (auto w = it; w != cluster_waiters_.end(); ++w) {
    if (!view) view = std::make_shared<const v1::ClusterView>(ViewLocked());
    deferred->push_back([done = std::move(w->done), view] { done(view); });
  }
  cluster_waiters_.erase(it, cluster_waiters_.end());
}

StatusOr<v1::RegisterResponse> SchedulerState::Register(const v1::RegisterRequest& req) {
  if (!KnownRole(req.role())) {
    return InvalidArgumentError("role must be ROLE_SERVER or ROLE_WORKER, got " +
                                std::to_string(static_cast<int>(req.role())));
  }
  if (req.pod_name().empty()) return InvalidArgumentError("pod_name must be set");
  if (req.pod_name().size() > 253) {
    return InvalidArgumentError("pod_name must be at most 253 characters, got " +
                                std::to_string(req.pod_name().size()));
  }
  if (req.gpus() < 0) {
    return InvalidArgumentError("gpus must be >= 0, got " + std::to_string(req.gpus()));
  }
  if (!config_.job_name.empty() && !req.job().empty() && req.job() != config_.job_name) {
    return InvalidArgumentError("registration for job \"" + req.job() +
                                "\" reached the scheduler of job \"" + config_.job_name + "\"");
  }
  Deferred deferred;
  v1::RegisterResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int32_t rank;
    auto it = pods_.find(req.pod_name());
    if (it != pods_.end()) {
      if (it->second.first != req.role()) {
        return InvalidArgumentError("pod " + req.pod_name() + " is registered as " +
                                    RoleName(it->second.first) + " " +
                                    std::to_string(it->second.second) + ", cannot register as " +
                                    RoleName(req.role()));
      }
      rank = it->second.second;
      Node& n = NodeLocked(req.role(), rank);
      if (req.resume() && req.previous_incarnation() > 0 &&
          req.previous_incarnation() <= n.incarnation) {
        // The agent thought the scheduler restarted (its calls failed for a while) and this one
        // already knows it: nothing changes but that the node is seen again.
        if (n.dead) TLOG_INFO << RoleName(req.role()) << " " << rank << " revived by re-registration";
      } else {
        ++n.incarnation;
        if (n.restart_reported) {
          n.restart_reported = false;  // counted when the exit was reported
        } else {
          ++n.restarts;
          ++stats_.restarts;
        }
        if (n.dead) TLOG_INFO << RoleName(req.role()) << " " << rank << " revived by re-registration";
        if (n.preempted) {
          TLOG_INFO << RoleName(req.role()) << " " << rank << ": the replacement of the stopped pod "
                    << req.pod_name() << " registered after "
                    << Seconds(clock_->Now() - n.preempted_at) << " s";
        }
        n.preempted = false;
        n.exited = false;
        n.program_reporting = false;  // the new program is judged once it reports
        n.step = -1;
        n.host = req.host();
        n.gpus = req.gpus();
        TLOG_INFO << RoleName(req.role()) << " " << rank << " (pod " << req.pod_name()
                  << ") re-registered, incarnation " << n.incarnation;
      }
      n.dead = false;
      n.last_seen = clock_->Now();
    } else if (req.previous_incarnation() > 0) {
      TRELLIS_ASSIGN_OR_RETURN(rank, AdoptLocked(req));
    } else {
      int32_t& count =
          req.role() == v1::ROLE_SERVER ? registered_servers_ : registered_workers_;
      const int32_t expected =
          req.role() == v1::ROLE_SERVER ? config_.num_servers : config_.num_workers;
      if (count >= expected) {
        rank = TakeOrphanLocked(req);
        if (rank < 0) {
          return ResourceExhaustedError("the job expects " + std::to_string(expected) + " " +
                                        RoleName(req.role()) + "s and all ranks are taken; pod " +
                                        req.pod_name() + " cannot register");
        }
      } else {
        rank = PreferredFreeRankLocked(req.role(), req.pod_name(), expected);
        ++count;
        Node& n = NodeLocked(req.role(), rank);
        n.registered = true;
        n.pod_name = req.pod_name();
        n.host = req.host();
        n.gpus = req.gpus();
        n.incarnation = 1;
        n.last_seen = clock_->Now();
        pods_.emplace(req.pod_name(), std::make_pair(req.role(), rank));
        TLOG_INFO << RoleName(req.role()) << " " << rank << " registered: pod " << req.pod_name()
                  << " host " << req.host();
      }
    }
    ++stats_.registrations;
    resp.set_rank(rank);
    resp.set_incarnation(NodeLocked(req.role(), rank).incarnation);
    resp.set_num_servers(config_.num_servers);
    resp.set_num_workers(config_.num_workers);
    resp.set_scheduler_id(instance_id_);
    ChangedLocked(&deferred);
    MaybeFinishRecoveryLocked(clock_->Now(), &deferred);
  }
  Run(deferred);
  return resp;
}

Status SchedulerState::ReportReady(const v1::ReportReadyRequest& req) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TRELLIS_RETURN_IF_ERROR(CheckNodeLocked(req.role(), req.rank(), true));
    if (req.role() == v1::ROLE_SERVER && req.address().empty()) {
      return InvalidArgumentError("server " + std::to_string(req.rank()) +
                                  ": address (host:port of the data service) must be set");
    }
    Node& n = NodeLocked(req.role(), req.rank());
    n.ready = true;
    n.address = req.address();
    n.last_seen = clock_->Now();
    TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " ready at " << req.address();
    ChangedLocked(&deferred);
  }
  Run(deferred);
  return Status::Ok();
}

v1::ClusterView SchedulerState::GetCluster() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ViewLocked();
}

void SchedulerState::WaitCluster(const v1::GetClusterRequest& req, TimePoint deadline,
                                 Callback<std::shared_ptr<const v1::ClusterView>> done) {
  std::shared_ptr<const v1::ClusterView> view;
  std::unique_lock<std::mutex> lock(mu_);
  if (shutdown_) {
    lock.unlock();
    done(UnavailableError("scheduler is shutting down"));
    return;
  }
  const bool ready = version_ > req.after_version() &&
                     (!req.wait_complete() || CompleteLocked() || failed_);
  if (ready || deadline <= clock_->Now()) {
    view = std::make_shared<const v1::ClusterView>(ViewLocked());
    lock.unlock();
    done(std::move(view));
    return;
  }
  cluster_waiters_.push_back({req.after_version(), req.wait_complete(), deadline, std::move(done)});
}

void SchedulerState::FailJobLocked(std::string message, Deferred* deferred) {
  if (failed_) return;
  failed_ = true;
  failure_message_ = std::move(message);
  TLOG_ERROR << "job failed: " << failure_message_;
  const Status st = AbortedError("job failed: " + failure_message_);
  FailDeclarationsLocked(st, deferred);
  for (auto& [name, g] : barriers_) {
    for (auto& w : g.waiters) deferred->push_back([done = std::move(w.done), st] { done(st); });
    g.waiters.clear();
  }
}

StatusOr<v1::HeartbeatResponse> SchedulerState::Heartbeat(const v1::HeartbeatRequest& req) {
  Deferred deferred;
  v1::HeartbeatResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TRELLIS_RETURN_IF_ERROR(CheckNodeLocked(req.role(), req.rank(), true));
    Node& n = NodeLocked(req.role(), req.rank());
    if (req.incarnation() != 0 && req.incarnation() < n.incarnation) {
      return FailedPreconditionError(std::string(RoleName(req.role())) + " " +
                                     std::to_string(req.rank()) + ": stale incarnation " +
                                     std::to_string(req.incarnation()) + ", current is " +
                                     std::to_string(n.incarnation));
    }
    n.last_seen = clock_->Now();
    n.state = req.state().substr(0, 256);
    if (n.dead) {
      n.dead = false;
      TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " (pod " << n.pod_name
                << ") revived by a heartbeat";
      ChangedLocked(&deferred);
    }
    resp.set_cluster_version(version_);
    for (int32_t r = 0; r < config_.num_servers; ++r) {
      if (servers_[static_cast<size_t>(r)].dead) {
        FillNodeLocked(servers_[static_cast<size_t>(r)], v1::ROLE_SERVER, r, resp.add_dead());
      }
    }
    for (int32_t r = 0; r < config_.num_workers; ++r) {
      if (workers_[static_cast<size_t>(r)].dead) {
        FillNodeLocked(workers_[static_cast<size_t>(r)], v1::ROLE_WORKER, r, resp.add_dead());
      }
    }
    resp.set_job_failed(failed_);
    resp.set_failure_message(failure_message_);
    if (n.stalled) {  // scheduler_state_stalls.cc: the agent kills and restarts its program
      resp.set_restart_program(true);
      resp.set_restart_reason(n.stall_reason);
    }
  }
  Run(deferred);
  return resp;
}

Status SchedulerState::ReportExit(const v1::ReportExitRequest& req) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TRELLIS_RETURN_IF_ERROR(CheckNodeLocked(req.role(), req.rank(), true));
    Node& n = NodeLocked(req.role(), req.rank());
    if (req.incarnation() != 0 && req.incarnation() < n.incarnation) {
      return FailedPreconditionError(std::string(RoleName(req.role())) + " " +
                                     std::to_string(req.rank()) + ": stale incarnation " +
                                     std::to_string(req.incarnation()) + ", current is " +
                                     std::to_string(n.incarnation));
    }
    n.last_exit_code = req.exit_code();
    n.last_seen = clock_->Now();
    n.ready = false;  // the program is gone; a restarted one reports ready again
    NoteExitLocked(n, req.will_restart(), n.last_seen);
    std::string what = std::string(RoleName(req.role())) + " " + std::to_string(req.rank()) +
                       " (pod " + n.pod_name + ")";
    // Once every worker finished, a stop is the end of the run (servers and launchers stop
    // their pods then), not a preemption to wait out.
    const bool finished = std::all_of(workers_.begin(), workers_.end(), [](const Node& w) {
      return w.registered && w.exited && w.last_exit_code == 0;
    });
    if (req.preempted() && !req.will_restart() && !finished) {
      // A pod deletion or eviction, not a failure of the program: keep the rank for the
      // replacement pod (same name), which registers as the next incarnation and rejoins.
      n.preempted = true;
      n.preempted_at = n.last_seen;
      TLOG_WARN << what << " was stopped from outside (" << DescribeExitCode(req.exit_code())
                << "; its pod was deleted or evicted): keeping its rank for the replacement pod for "
                << Seconds(config_.replacement_timeout) << " s";
    } else if (req.will_restart()) {
      ++n.restarts;
      ++n.program_restarts;
      ++stats_.restarts;
      n.restart_reported = true;
      TLOG_WARN << what << " exited with " << DescribeExitCode(req.exit_code())
                << ", restarting (restart " << n.restarts << ")";
    } else {
      n.exited = true;
      TLOG_INFO << what << " exited for good: " << DescribeExitCode(req.exit_code());
      if (req.role() == v1::ROLE_WORKER && req.exit_code() != 0) {
        std::string msg = what + " failed: " + DescribeExitCode(req.exit_code());
        if (!req.message().empty()) msg += ": " + req.message().substr(0, 1024);
        FailJobLocked(std::move(msg), &deferred);
      }
    }
    ChangedLocked(&deferred);
  }
  Run(deferred);
  return Status::Ok();
}

Status SchedulerState::Leave(const v1::LeaveRequest& req) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TRELLIS_RETURN_IF_ERROR(CheckNodeLocked(req.role(), req.rank(), true));
    Node& n = NodeLocked(req.role(), req.rank());
    n.exited = true;
    TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " (pod " << n.pod_name << ") left";
    ChangedLocked(&deferred);
  }
  Run(deferred);
  return Status::Ok();
}

void SchedulerState::Sweep() {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    const TimePoint now = clock_->Now();
    MaybeFinishRecoveryLocked(now, &deferred);
    bool changed = false;
    auto check = [&](std::vector<Node>& nodes, v1::Role role) {
      // Nobody is declared dead while the members of a running job come back to a restarted
      // scheduler: the grace period's end starts everyone's heartbeat timeout afresh.
      if (recovering_) return;
      for (size_t r = 0; r < nodes.size(); ++r) {
        Node& n = nodes[r];
        if (!n.registered || n.exited || n.dead) continue;
        if (n.preempted) {  // known to be away: its own deadline, not the heartbeat's
          if (now - n.preempted_at > config_.replacement_timeout) {
            n.exited = true;
            changed = true;
            FailJobLocked(std::string(RoleName(role)) + " " + std::to_string(r) + " (pod " +
                              n.pod_name + ") was stopped from outside (pod deleted or evicted) " +
                              "and no replacement pod registered within " +
                              std::to_string(config_.replacement_timeout.count() / 1000) + " s",
                          &deferred);
          }
          continue;
        }
        if (now - n.last_seen > config_.heartbeat_timeout) {
          n.dead = true;
          ++stats_.dead_detected;
          changed = true;
          TLOG_WARN << RoleName(role) << " " << r << " (pod " << n.pod_name << ") silent for "
                    << Seconds(now - n.last_seen) << " s: marked dead";
        }
      }
    };
    check(servers_, v1::ROLE_SERVER);
    check(workers_, v1::ROLE_WORKER);
    SweepStallsLocked(now, &changed, &deferred);
    if (changed) ChangedLocked(&deferred);

    // Waiters past their deadline: GetCluster answers with the view as it is, the others fail.
    std::shared_ptr<const v1::ClusterView> view;
    auto cit = std::partition(cluster_waiters_.begin(), cluster_waiters_.end(),
                              [&](const ClusterWaiter& w) { return w.deadline > now; });
    for (auto w = cit; w != cluster_waiters_.end(); ++w) {
      if (!view) view = std::make_shared<const v1::ClusterView>(ViewLocked());
      deferred.push_back([done = std::move(w->done), view] { done(view); });
    }
    cluster_waiters_.erase(cit, cluster_waiters_.end());

    auto dit = std::partition(declare_waiters_.begin(), declare_waiters_.end(),
                              [&](const DeclareWaiter& w) { return w.deadline > now; });
    if (dit != declare_waiters_.end()) {
      const Status st = DeadlineExceededError(
          "waiting for key declarations: " + std::to_string(declared_ranks_.size()) + " of " +
          std::to_string(config_.num_workers) + " workers declared; missing worker " +
          MissingDeclarersLocked());
      for (auto w = dit; w != declare_waiters_.end(); ++w) {
        deferred.push_back([done = std::move(w->done), st] { done(st); });
      }
      declare_waiters_.erase(dit, declare_waiters_.end());
    }

    // A deferred-init round not complete by the first waiter's deadline fails for everyone in
    // it, naming the keys and who did not declare them: never a hang.
    const bool ext_expired = std::any_of(ext_waiters_.begin(), ext_waiters_.end(),
                                         [&](const DeclareWaiter& w) { return w.deadline <= now; });
    if (ext_expired) {
      std::string missing;
      for (int32_t r = 0; r < config_.num_workers; ++r) {
        if (ext_ranks_.count(r) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      const Status st = DeadlineExceededError(
          "key declaration after training started: " + AddedKeysLocked() + " declared by " +
          std::to_string(ext_ranks_.size()) + " of " + std::to_string(config_.num_workers) +
          " workers; worker " + missing + " did not declare it (every worker must)");
      TLOG_ERROR << st.message();
      CloseExtensionLocked(st, &deferred);
    }

    for (auto& named : barriers_) {
      const std::string& name = named.first;  // not a structured binding: clang 14 cannot
      auto& g = named.second;                 // capture one in a lambda
      auto bit = std::partition(g.waiters.begin(), g.waiters.end(),
                                [&](const BarrierWaiter& w) { return w.deadline > now; });
      if (bit == g.waiters.end()) continue;
      std::string missing;
      int listed = 0;
      auto note = [&](v1::Role role, int32_t n) {
        for (int32_t r = 0; r < n && listed < 10; ++r) {
          if (g.arrived.count({static_cast<int>(role), r}) != 0) continue;
          missing += (listed++ == 0 ? "" : ", ") + std::string(RoleName(role)) + " " +
                     std::to_string(r);
        }
      };
      note(v1::ROLE_WORKER, config_.num_workers);
      if (g.all_nodes) note(v1::ROLE_SERVER, config_.num_servers);
      const size_t members = static_cast<size_t>(config_.num_workers) +
                             (g.all_nodes ? static_cast<size_t>(config_.num_servers) : 0);
      const Status st = DeadlineExceededError(
          "barrier \"" + name + "\" generation " + std::to_string(g.released) + ": " +
          std::to_string(g.arrived.size()) + " of " + std::to_string(members) +
          " arrived; waiting for " + missing);
      for (auto w = bit; w != g.waiters.end(); ++w) {
        deferred.push_back([done = std::move(w->done), st] { done(st); });
      }
      g.waiters.erase(bit, g.waiters.end());
    }
    SweepGroupKeysLocked(now, &deferred);
    SweepRejoinsLocked(now, &deferred);
  }
  Run(deferred);
}

SchedulerState::TimePoint SchedulerState::NextDeadline() const {
  std::lock_guard<std::mutex> lock(mu_);
  TimePoint next = TimePoint::max();
  for (const auto& w : cluster_waiters_) next = std::min(next, w.deadline);
  for (const auto& w : declare_waiters_) next = std::min(next, w.deadline);
  for (const auto& w : ext_waiters_) next = std::min(next, w.deadline);
  for (const auto& [name, g] : barriers_) {
    for (const auto& w : g.waiters) next = std::min(next, w.deadline);
  }
  for (const auto& [name, k] : group_keys_) {
    for (const auto& w : k.waiters) next = std::min(next, w.deadline);
  }
  return std::min(next, NextRejoinDeadlineLocked());
}

void SchedulerState::Shutdown() {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    const Status st = UnavailableError("scheduler is shutting down");
    for (auto& w : cluster_waiters_) deferred.push_back([done = std::move(w.done), st] { done(st); });
    cluster_waiters_.clear();
    FailDeclarationsLocked(st, &deferred);
    for (auto& [name, g] : barriers_) {
      for (auto& w : g.waiters) deferred.push_back([done = std::move(w.done), st] { done(st); });
      g.waiters.clear();
    }
    for (auto& [name, k] : group_keys_) {
      for (auto& w : k.waiters) deferred.push_back([done = std::move(w.done), st] { done(st); });
      k.waiters.clear();
    }
    FailRejoinsLocked(st, &deferred);
  }
  Run(deferred);
}

SchedulerStats SchedulerState::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  s.version = version_;
  s.waiters = static_cast<int64_t>(cluster_waiters_.size() + declare_waiters_.size() +
                                   ext_waiters_.size());
  for (const auto& [name, g] : barriers_) s.waiters += static_cast<int64_t>(g.waiters.size());
  for (const auto& [name, k] : group_keys_) s.waiters += static_cast<int64_t>(k.waiters.size());
  s.waiters += static_cast<int64_t>(RejoinWaitersLocked());
  s.recovering = recovering_;
  int role = 0;
  for (const auto* nodes : {&servers_, &workers_}) {
    for (const Node& n : *nodes) {
      s.registered[role] += n.registered ? 1 : 0;
      s.dead[role] += n.dead ? 1 : 0;
      s.restarts_of[role] += n.restarts;
    }
    ++role;
  }
  return s;
}

}  // namespace trellis
