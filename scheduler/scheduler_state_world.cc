// SchedulerState: elastic jobs -- a resize asked for, and the workers' reports of the steps they
// reached until it is decided (world_plan.h, docs/elastic.md).
#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"

namespace trellis {
StatusOr<v1::ResizeResponse> SchedulerState::Resize(const v1::ResizeRequest& req) {
  MutexLock lock(&mu_);
  TRELLIS_RETURN_IF_ERROR(OpenLocked(/*failed_counts=*/true));
  if (!stop_reason_.empty()) {
    return FailedPreconditionError("the job is being stopped (" + stop_reason_ +
                                   "): no resize now");
  }
  if (members_.AnyWorkerExited()) {
    return FailedPreconditionError("the job is ending (a worker finished): no resize now");
  }
  if (req.servers() != 0) return ResizeServersLocked(req);
  auto r = world_.Resize(req.workers(), req.reason(), UnixMillisNow());
  if (r.ok() && world_.pending_epoch() != 0) {
    TLOG_INFO << "resize to " << req.workers() << " workers asked for (" << req.reason()
              << "): world " << world_.pending_epoch() << " starts after the step every worker "
              << "reaches next" << (req.workers() > world_.size() ? ", once the workers joining asked to join" : "");
  }
  return r;
}

StatusOr<v1::ResizeResponse> SchedulerState::ResizeServersLocked(const v1::ResizeRequest& req) {
  if (req.workers() != 0 && req.workers() != world_.size()) {
    return InvalidArgumentError("resize to " + std::to_string(req.workers()) + " workers and " +
                                std::to_string(req.servers()) +
                                " servers: one kind at a time (resize the workers, then the servers)");
  }
  if (req.servers() != world_.servers() && world_.bounds().enabled && world_.pending_epoch() == 0) {
    // The slices move at a step boundary from the map the workers hold.
    if (!shards_.has_map()) {
      return FailedPreconditionError("no resize of the servers before the workers declared their keys "
                                     "(the shard map is built then); ask again once the job trains");
    }
    if (shards_.extending()) {
      return FailedPreconditionError("keys declared after training started are being added to the shard "
                                     "map; ask again once they are");
    }
  }
  // Every slice moves from its owner at the boundary: a server of the world that is restarting or
  // being taken over (docs/elastic.md#losing-a-server) must serve first, or the workers could not
  // reach it once the new world leaves it out.
  if (req.servers() != world_.servers() && world_.pending_epoch() == 0) {
    for (int32_t r = 0; r < world_.servers() && r < members_.size(v1::ROLE_SERVER); ++r) {
      const Membership::Member& m = members_.at(v1::ROLE_SERVER, r);
      // (One not registered again yet after a scheduler restart is not known to be away.)
      if (m.registered && (m.restarting || (!m.taken_over_by.empty() && !m.ready))) {
        return FailedPreconditionError("server " + std::to_string(r) + " is " +
                                       (m.taken_over_by.empty() ? "restarting" : "being taken over by pod " + m.taken_over_by) +
                                       "; resize the servers once it serves again");
      }
    }
  }
  std::set<int32_t> not_ready;
  for (int32_t r = world_.servers(); r < req.servers() && r < members_.size(v1::ROLE_SERVER); ++r) {
    if (!members_.ServerReady(r)) not_ready.insert(r);
  }
  auto r = world_.ResizeServers(req.servers(), not_ready, req.reason(), UnixMillisNow());
  if (r.ok() && world_.pending_epoch() != 0) {
    TLOG_INFO << "resize to " << req.servers() << " servers asked for (" << req.reason() << "): world "
              << world_.pending_epoch() << " starts after the step every worker reaches next"
              << (world_.announced_epoch() == 0 ? ", once the servers added are ready" : "")
              << "; the slices move there";
  }
  return r;
}

v1::ReachStepResponse SchedulerState::DecidedAnswerLocked(const v1::WorldInfo& world) const {
  v1::ReachStepResponse resp;
  resp.set_decided(true);
  *resp.mutable_world() = world;
  // A server resize: the map every member switches to, and where its servers are.
  if (server_move_ && server_move_->epoch == world.epoch()) {
    *resp.mutable_shard_map() = *server_move_->map;
    for (const auto& a : server_move_->addresses) resp.add_server_addresses(a);
  }
  return resp;
}

void SchedulerState::ReachStep(const v1::ReachStepRequest& req, TimePoint deadline,
                               Callback<v1::ReachStepResponse> done) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    Status st = members_.Check(v1::ROLE_WORKER, req.rank(), true);
    if (st.ok()) st = OpenLocked(/*failed_counts=*/true);
    v1::WorldInfo world;
    StatusOr<bool> decided = st;
    // A lost worker's program back (a late replacement) asks to join: the world grows back to
    // take it in, unless the job is ending.
    if (st.ok() && req.step() < 0 && world_.bounds().enabled && stop_reason_.empty() &&
        !members_.AnyWorkerExited() && world_.GrowBack(req.rank(), req.epoch(), UnixMillisNow())) {
      TLOG_INFO << "worker " << req.rank() << " came back after it was lost: growing the world back to "
                << world_.pending_members().size() << " workers (world " << world_.pending_epoch()
                << ", after the step every worker reaches next)";
      ChangedLocked(&deferred);  // the view's resize under way
    }
    if (st.ok()) decided = world_.Reach(req.rank(), req.epoch(), req.step(), UnixMillisNow(), &world);
    if (!decided.ok()) {
      deferred.push_back([done = std::move(done), st = decided.status()] { done(st); });
    } else if (*decided) {
      if (world.epoch() > resizes_answered_) WorldDecidedLocked(world, &deferred);
      deferred.push_back([done = std::move(done), resp = DecidedAnswerLocked(world)] { done(resp); });
    } else if (req.wait()) {
      // One waiting report per worker: a newer one answers the older (undecided), so the
      // waiters are bounded by the workers whatever a peer sends.
      AnswerReachWaitersLocked([&](const ReachWaiter& w) { return w.rank == req.rank(); },
                               v1::ReachStepResponse(), &deferred);
      reach_waiters_.push_back({req.rank(), req.epoch(), deadline, std::move(done)});
    } else {
      deferred.push_back([done = std::move(done)] { done(v1::ReachStepResponse()); });
    }
  }
  RunDeferred(deferred);
}

void SchedulerState::WorldDecidedLocked(const v1::WorldInfo& world, Deferred* deferred) {
  resizes_answered_ = world.epoch();
  for (int32_t r = 0; r < members_.size(v1::ROLE_WORKER); ++r) members_.SetDeparted(r, world_.Departed(r));
  const v1::ResizeInfo& info = world_.resizes().back();
  if (world.servers() > 0 && world.servers() != members_.ServersInForce()) {
    // A server resize: the map laid out on the new servers, and their addresses (a grow is
    // decided only once they are ready).
    auto map = shards_.Relayout(world.servers(), world.epoch());
    if (!map.ok()) {
      FailJobLocked("resize to " + std::to_string(world.servers()) + " servers: " + map.status().message(),
                    deferred);
      return;
    }
    ServerMove move{world.epoch(), *map, {}};
    for (int32_t r = 0; r < world.servers(); ++r) move.addresses.push_back(members_.at(v1::ROLE_SERVER, r).address);
    for (int32_t r = 0; r < members_.size(v1::ROLE_SERVER); ++r) members_.SetServerDeparted(r, r >= world.servers());
    server_move_ = std::move(move);
    TLOG_INFO << "resize decided: " << info.from_servers() << " -> " << info.to_servers()
              << " servers from step " << world.from_step() << " ("
              << info.decided_unix_ms() - info.asked_unix_ms() << " ms after it was asked for)";
  } else {
    TLOG_INFO << "resize decided: " << info.from_workers() << " -> " << info.to_workers()
              << " workers from step " << world.from_step() << " ("
              << info.decided_unix_ms() - info.asked_unix_ms() << " ms after it was asked for)";
  }
  const v1::ReachStepResponse resp = DecidedAnswerLocked(world);
  AnswerReachWaitersLocked([&](const ReachWaiter& w) { return w.epoch == world.epoch(); }, resp,
                           deferred);
  ChangedLocked(deferred);  // the view's world changed
}

Status SchedulerState::AdoptWorldLocked(int32_t by, const v1::WorldInfo& world, Deferred* deferred) {
  TRELLIS_ASSIGN_OR_RETURN(const bool adopted, world_.Adopt(world));
  if (!adopted) return Status::Ok();
  resizes_answered_ = std::max(resizes_answered_, world.epoch());
  for (int32_t r = 0; r < members_.size(v1::ROLE_WORKER); ++r) members_.SetDeparted(r, world_.Departed(r));
  // The world's servers are ranks 0..servers-1 (a server resize's; world_plan.h).
  for (int32_t r = 0; r < members_.size(v1::ROLE_SERVER); ++r) members_.SetServerDeparted(r, r >= world_.servers());
  TLOG_INFO << "world " << world.epoch() << " handed back by worker " << by << ": "
            << world.members_size() << " workers and " << world_.servers() << " servers from step "
            << world.from_step()
            << " (the workers resized away are not awaited)";
  ChangedLocked(deferred);  // the view's world changed
  return Status::Ok();
}

void SchedulerState::LoseWorkerLocked(int32_t rank, const std::string& why, Deferred* deferred, bool silent) {
  if (!world_.bounds().enabled) {
    FailJobLocked(why, deferred);
    return;
  }
  const int64_t now = UnixMillisNow();
  auto lost = world_.Lose(rank, why, now, silent);
  if (!lost.ok()) {
    FailJobLocked(lost.status().message(), deferred);
    return;
  }
  if (!*lost) {  // outside the world already: its end changes nothing
    TLOG_WARN << why << " (it was not in the job's world: the job goes on)";
    return;
  }
  members_.SetDeparted(rank, true);
  ++workers_lost_;
  TLOG_WARN << why << ": the job goes on without it (spec.elastic); world " << world_.pending_epoch()
            << " of " << world_.pending_members().size() << " workers starts after the step every other "
            << "worker reaches next";
  v1::WorldInfo world;
  if (world_.DecideIfReported(now, &world)) WorldDecidedLocked(world, deferred);
  ChangedLocked(deferred);
}

void SchedulerState::SweepReachWaitersLocked(TimePoint now, Deferred* deferred) {
  // Undecided at the deadline: the worker asks again (its own deadline decides).
  AnswerReachWaitersLocked([now](const ReachWaiter& w) { return w.deadline <= now; },
                           v1::ReachStepResponse(), deferred);
}

void SchedulerState::AnswerReachWaitersLocked(const std::function<bool(const ReachWaiter&)>& which,
                                              const v1::ReachStepResponse& answer,
                                              Deferred* deferred) {
  for (auto it = reach_waiters_.begin(); it != reach_waiters_.end();) {
    if (which(*it)) {
      deferred->push_back([done = std::move(it->done), answer] { done(answer); });
      it = reach_waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void SchedulerState::FailReachWaitersLocked(const Status& st, Deferred* deferred) {
  for (auto& w : reach_waiters_) deferred->push_back([done = std::move(w.done), st] { done(st); });
  reach_waiters_.clear();
}

v1::WorldInfo SchedulerState::World(int64_t* pending_epoch, std::vector<v1::ResizeInfo>* resizes,
                                    std::vector<int32_t>* pending_members, int32_t* pending_servers) const {
  MutexLock lock(&mu_);
  if (pending_epoch != nullptr) *pending_epoch = world_.pending_epoch();
  if (pending_servers != nullptr) *pending_servers = world_.pending_servers();
  if (resizes != nullptr) *resizes = world_.resizes();
  if (pending_members != nullptr) *pending_members = world_.pending_members();
  return world_.current();
}

}  // namespace trellis
