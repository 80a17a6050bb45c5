// SchedulerState: recovering a running job after the scheduler restarted
// (docs/scheduler.md#scheduler-restart). A restarted scheduler knows nothing; the members do.
// Agents register again with the rank and incarnation they hold, servers report ready again,
// workers hand back the shard map and the servers' addresses (Resume). Until every member is
// back, or the grace period ends, nobody is declared dead.
#include <algorithm>
#include <chrono>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/shard_map.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

void SchedulerState::BeginRecoveryLocked(const char* why) {
  if (restarted_) return;
  restarted_ = true;
  recovering_ = true;
  ++stats_.recoveries;
  recovery_start_ = clock_->Now();
  recovery_deadline_ = recovery_start_ + config_.recovery_grace;
  // Rejoin ids tag stashes on the servers; the old scheduler's ids may still be there.
  next_rejoin_id_ = static_cast<uint64_t>(
                        std::chrono::system_clock::now().time_since_epoch().count()) << 8 | 1;
  TLOG_WARN << "the job was running before this scheduler started (" << why
            << "): recovering its state from the members; waiting up to "
            << Seconds(config_.recovery_grace) << " s for all " << config_.num_servers
            << " servers and " << config_.num_workers << " workers to register again";
}

StatusOr<int32_t> SchedulerState::AdoptLocked(const v1::RegisterRequest& req) {
  const v1::Role role = req.role();
  const int32_t expected = role == v1::ROLE_SERVER ? config_.num_servers : config_.num_workers;
  const int32_t rank = req.previous_rank();
  if (rank < 0 || rank >= expected) {
    return InvalidArgumentError("pod " + req.pod_name() + " held " + RoleName(role) + " rank " +
                                std::to_string(rank) + ", but the job has " +
                                std::to_string(expected) + " " + RoleName(role) + "s");
  }
  if (req.previous_restarts() < 0) {
    return InvalidArgumentError("previous_restarts must be >= 0, got " +
                                std::to_string(req.previous_restarts()));
  }
  Node& n = NodeLocked(role, rank);
  if (n.registered && !n.pod_name.empty()) {
    return FailedPreconditionError("pod " + req.pod_name() + " held " + RoleName(role) + " " +
                                   std::to_string(rank) + ", but pod " + n.pod_name +
                                   " holds it now");
  }
  BeginRecoveryLocked(("pod " + req.pod_name() + " holds " + RoleName(role) + " " +
                       std::to_string(rank)).c_str());
  if (!n.registered) {
    ++(role == v1::ROLE_SERVER ? registered_servers_ : registered_workers_);
  } else {
    TLOG_INFO << RoleName(role) << " " << rank << " came back after the recovery grace: revived";
  }
  n.registered = true;
  n.pod_name = req.pod_name();
  n.host = req.host();
  n.gpus = req.gpus();
  n.dead = false;
  n.exited = false;
  n.restart_reported = false;
  n.restarts = req.previous_restarts();
  // The agent's count: its program's restarts inside this pod (those of earlier pods are lost).
  n.program_restarts = std::max(n.program_restarts, req.previous_restarts());
  // resume: the program runs on under its incarnation; else the agent is starting it again.
  n.incarnation = req.resume() ? req.previous_incarnation() : req.previous_incarnation() + 1;
  if (!req.resume()) {
    n.ready = false;  // a restarted server reports its (new) address again
    n.address.clear();
  }
  n.last_seen = clock_->Now();
  pods_.emplace(req.pod_name(), std::make_pair(role, rank));
  TLOG_INFO << RoleName(role) << " " << rank << " (pod " << req.pod_name() << ") is back"
            << (req.resume() ? "" : " and restarting its program") << ", incarnation "
            << n.incarnation;
  return rank;
}

int32_t SchedulerState::TakeOrphanLocked(const v1::RegisterRequest& req) {
  const v1::Role role = req.role();
  const int32_t expected = role == v1::ROLE_SERVER ? config_.num_servers : config_.num_workers;
  auto orphan = [&](int32_t r) {
    const Node& n = NodeLocked(role, r);
    return n.registered && n.pod_name.empty();
  };
  int32_t rank = -1;
  // The pod's ordinal first ("<job>-worker-1" takes rank 1), as for a first registration.
  const size_t dash = req.pod_name().rfind('-');
  if (dash != std::string::npos && dash + 1 < req.pod_name().size() &&
      req.pod_name().size() - dash - 1 <= 9 &&
      req.pod_name().find_first_not_of("0123456789", dash + 1) == std::string::npos) {
    const int32_t ordinal = std::stoi(req.pod_name().substr(dash + 1));
    if (ordinal < expected && orphan(ordinal)) rank = ordinal;
  }
  for (int32_t r = 0; r < expected && rank < 0; ++r) {
    if (orphan(r)) rank = r;
  }
  if (rank < 0) return -1;
  Node& n = NodeLocked(role, rank);
  n.pod_name = req.pod_name();
  n.host = req.host();
  n.gpus = req.gpus();
  n.dead = false;
  n.exited = false;
  n.ready = false;
  n.address.clear();
  // Its old incarnation is unknown; > 1 tells a worker that it joins a running job.
  n.incarnation = std::max<int64_t>(n.incarnation, 1) + 1;
  ++n.restarts;
  ++stats_.restarts;
  n.last_seen = clock_->Now();
  pods_.emplace(req.pod_name(), std::make_pair(role, rank));
  TLOG_INFO << RoleName(role) << " " << rank << " (missing since the scheduler restarted) taken "
            << "by pod " << req.pod_name() << ", incarnation " << n.incarnation;
  return rank;
}

void SchedulerState::MaybeFinishRecoveryLocked(TimePoint now, Deferred* deferred) {
  if (!recovering_) return;
  const bool all_back = registered_servers_ == config_.num_servers &&
                        registered_workers_ == config_.num_workers;
  if (!all_back && now < recovery_deadline_) return;
  recovering_ = false;
  int missing = 0;
  std::string names;
  auto finish = [&](std::vector<Node>& nodes, v1::Role role) {
    for (size_t r = 0; r < nodes.size(); ++r) {
      Node& n = nodes[r];
      n.last_seen = now;  // heartbeat timeouts start afresh
      if (n.registered) continue;
      // The normal dead-node path: shown dead, never a donor; the pod may still come back.
      n.registered = true;
      n.dead = true;
      ++stats_.dead_detected;
      ++(role == v1::ROLE_SERVER ? registered_servers_ : registered_workers_);
      if (missing++ < 10) names += (names.empty() ? "" : ", ") + std::string(RoleName(role)) + " " + std::to_string(r);
    }
  };
  finish(servers_, v1::ROLE_SERVER);
  finish(workers_, v1::ROLE_WORKER);
  const double took = Seconds(now - recovery_start_);
  if (missing == 0) {
    TLOG_INFO << "recovered the running job after a scheduler restart: all "
              << config_.num_servers << " servers and " << config_.num_workers
              << " workers are back after " << took << " s" << (shard_map_ ? "" : " (no shard map yet)");
  } else {
    TLOG_WARN << "recovery after a scheduler restart ended after " << took << " s: " << missing
              << " member(s) did not come back (" << names << "): marked dead";
  }
  ChangedLocked(deferred);
}

Status SchedulerState::InstallShardMapLocked(int32_t rank, const v1::ShardMap& map,
                                             Deferred* deferred) {
  if (shard_map_) {
    if (ShardMapBytes(*shard_map_) == ShardMapBytes(map)) return Status::Ok();
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " holds a shard map that differs from the one handed back "
                                   "first (worker " + std::to_string(reference_rank_) + ")");
  }
  TRELLIS_RETURN_IF_ERROR(ValidateShardMap(map, config_.num_servers, config_.dispatch,
                                           config_.slice_bytes)
                              .Annotate("shard map handed back by worker " + std::to_string(rank)));
  std::vector<v1::KeySpec> keys;
  keys.reserve(static_cast<size_t>(map.keys_size()));
  for (const auto& k : map.keys()) keys.push_back(k.key());
  const KeyPtrs ptrs = SortedById(keys);
  // Declarations that arrived before the map came back: answered if they are the map's keys.
  const bool same = reference_rank_ < 0 || SameKeys(reference_ptrs_, ptrs);
  reference_keys_ = std::move(keys);
  reference_ptrs_ = SortedById(reference_keys_);
  reference_rank_ = rank;
  shard_map_ = std::make_shared<const v1::ShardMap>(map);
  for (int32_t r = 0; r < config_.num_workers; ++r) declared_ranks_.insert(r);
  TLOG_INFO << "shard map handed back by worker " << rank << ": " << map.keys_size() << " keys";
  const Status mismatch = FailedPreconditionError(
      "the keys declared after the scheduler restarted differ from the running job's shard map");
  for (auto& w : declare_waiters_) {
    if (same) {
      deferred->push_back([done = std::move(w.done), m = shard_map_] { done(m); });
    } else {
      deferred->push_back([done = std::move(w.done), mismatch] { done(mismatch); });
    }
  }
  declare_waiters_.clear();
  return Status::Ok();
}

StatusOr<v1::ResumeResponse> SchedulerState::Resume(const v1::ResumeRequest& req) {
  if (req.server_addresses_size() > config_.num_servers) {
    return InvalidArgumentError("worker " + std::to_string(req.rank()) + " hands back " +
                                std::to_string(req.server_addresses_size()) +
                                " server addresses; the job has " +
                                std::to_string(config_.num_servers) + " servers");
  }
  for (const auto& a : req.server_addresses()) {
    if (a.size() > 512) return InvalidArgumentError("server address longer than 512 characters");
  }
  Deferred deferred;
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TRELLIS_RETURN_IF_ERROR(CheckNodeLocked(v1::ROLE_WORKER, req.rank(), false));
    if (shutdown_) return UnavailableError("scheduler is shutting down");
    BeginRecoveryLocked(("worker " + std::to_string(req.rank()) + " hands back its state").c_str());
    if (req.has_shard_map()) st = InstallShardMapLocked(req.rank(), req.shard_map(), &deferred);
    // Addresses of servers that have not reported ready themselves yet (their own report wins).
    for (int32_t r = 0; r < req.server_addresses_size(); ++r) {
      Node& s = servers_[static_cast<size_t>(r)];
      if (!s.ready && !req.server_addresses(r).empty()) {
        s.ready = true;
        s.address = req.server_addresses(r);
      }
    }
    ChangedLocked(&deferred);
  }
  Run(deferred);
  if (!st.ok()) {
    TLOG_ERROR << st.message();
    return st;
  }
  v1::ResumeResponse resp;
  resp.set_scheduler_id(instance_id_);
  return resp;
}

}  // namespace trellis
