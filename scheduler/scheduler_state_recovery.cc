// SchedulerState: registration, and recovering a running job after the scheduler restarted
// (restart_recovery.h): a pod that held a rank under the old scheduler gets it back, a worker
// hands back the shard map and the servers' addresses, and the grace period ends.
#include <chrono>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"

namespace trellis {

StatusOr<v1::RegisterResponse> SchedulerState::Register(const v1::RegisterRequest& req) {
  TRELLIS_RETURN_IF_ERROR(Membership::CheckRequest(req, config_));
  Deferred deferred;
  v1::RegisterResponse resp;
  {
    MutexLock lock(&mu_);
    // Recreated after its program had finished (deleted in the job's last moments): there is
    // nothing left for it to do, and a new program could not join a job that has ended.
    int32_t done = req.role() == v1::ROLE_WORKER ? members_.FinishedWorker(req.pod_name()) : -1;
    // A worker resized away that a grow under way brings back runs again (world_plan.h); so
    // does a lost one's replacement (it asks to join and the world grows back: GrowBack).
    if (done >= 0 && (world_.Joining(done) || world_.IsLost(done))) done = -1;
    if (done < 0 && !stop_reason_.empty()) {
      // Replacement pods of a job stopped as a whole (every pod deleted) start while this
      // scheduler still waits for the exit checkpoint: they belong to the job's next run, with
      // the next scheduler, not to this one (the agent retries UNAVAILABLE).
      return UnavailableError("the job is being stopped (" + stop_reason_ +
                              "): this scheduler ends with it; register with the next one");
    }
    int32_t rank = done;
    if (done >= 0) {
      TLOG_INFO << "worker " << done << " (pod " << req.pod_name()
                << ") registered again after its program finished: it has nothing to run";
    } else {
      TRELLIS_ASSIGN_OR_RETURN(rank, RegisterLocked(req));
    }
    resp.set_finished(done >= 0);
    resp.set_rank(rank);
    resp.set_incarnation(members_.at(req.role(), rank).incarnation);
    resp.set_num_servers(config_.num_servers);
    resp.set_num_workers(config_.worker_slots());  // ranks 0..slots-1 (elastic: maxWorkers)
    resp.set_scheduler_id(instance_id_);
    if (done < 0) {  // a finished worker's registration changes nothing
      ChangedLocked(&deferred);
      MaybeFinishRecoveryLocked(clock_->Now(), &deferred);
    }
  }
  RunDeferred(deferred);
  return resp;
}

StatusOr<int32_t> SchedulerState::RegisterLocked(const v1::RegisterRequest& req) {
  if (members_.Known(req.pod_name()) || req.previous_incarnation() <= 0) {
    return members_.Register(req);
  }
  // A pod unknown here that held a rank: the job ran before this scheduler.
  TRELLIS_RETURN_IF_ERROR(members_.CheckAdoptable(req));
  BeginRecoveryLocked("pod " + req.pod_name() + " holds " + RoleName(req.role()) + " " +
                      std::to_string(req.previous_rank()));
  return members_.Adopt(req);
}

void SchedulerState::BeginRecoveryLocked(const std::string& why) {
  if (!recovery_.Begin(clock_->Now(), why)) return;
  // Rejoin ids tag stashes on the servers; the old scheduler's ids may still be there.
  rejoins_.RestartIdsAt(
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) << 8 |
      1);
}

void SchedulerState::MaybeFinishRecoveryLocked(TimePoint now, Deferred* deferred) {
  double took = 0;
  if (!recovery_.End(members_.AllRegistered(), now, &took)) return;
  std::string names;
  const int missing = members_.MarkMissingDead(now, &names);
  if (missing == 0) {
    TLOG_INFO << "recovered the running job after a scheduler restart: all "
              << members_.ServersInForce() << " servers and " << members_.WorldWorkers()
              << " workers are back after " << took << " s"
              << (shards_.has_map() ? "" : " (no shard map yet)");
  } else {
    TLOG_WARN << "recovery after a scheduler restart ended after " << took << " s: " << missing
              << " member(s) did not come back (" << names << "): marked dead";
  }
  ChangedLocked(deferred);
}

StatusOr<v1::ResumeResponse> SchedulerState::Resume(const v1::ResumeRequest& req) {
  // A job whose servers were resized hands back the world's (up to maxServers).
  if (req.server_addresses_size() > config_.server_slots()) {
    return InvalidArgumentError("worker " + std::to_string(req.rank()) + " hands back " +
                                std::to_string(req.server_addresses_size()) +
                                " server addresses; the job has at most " +
                                std::to_string(config_.server_slots()) + " servers");
  }
  for (const auto& a : req.server_addresses()) {
    if (a.size() > 512) return InvalidArgumentError("server address longer than 512 characters");
  }
  Deferred deferred;
  Status st;
  {
    MutexLock lock(&mu_);
    TRELLIS_RETURN_IF_ERROR(members_.Check(v1::ROLE_WORKER, req.rank(), false));
    TRELLIS_RETURN_IF_ERROR(OpenLocked(/*failed_counts=*/false));
    BeginRecoveryLocked("worker " + std::to_string(req.rank()) + " hands back its state");
    if (req.has_shard_map()) st = shards_.Install(req.rank(), req.shard_map(), &deferred);
    members_.AdoptServerAddresses(req);
    if (st.ok() && req.has_world()) st = AdoptWorldLocked(req.rank(), req.world(), &deferred);
    ChangedLocked(&deferred);
    MaybeFinishRecoveryLocked(clock_->Now(), &deferred);  // a departed worker is not awaited
  }
  RunDeferred(deferred);
  if (!st.ok()) {
    TLOG_ERROR << st.message();
    return st;
  }
  v1::ResumeResponse resp;
  resp.set_scheduler_id(instance_id_);
  return resp;
}

}  // namespace trellis
