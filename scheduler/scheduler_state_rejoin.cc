// SchedulerState: a restarted worker rejoining the running job (docs/checkpoints.md#crash-recovery-workers).
// The scheduler only matches a rejoiner with a donor and relays the donor's answer; the data
// travels through the parameter servers (kStash / kFetch).
#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

namespace {

// "rejoin 3 of worker 1 (incarnation 2)"
std::string RejoinLabel(uint64_t id, int32_t rank, int64_t incarnation) {
  return "rejoin " + std::to_string(id) + " of worker " + std::to_string(rank) +
         " (incarnation " + std::to_string(incarnation) + ")";
}

}  // namespace

int32_t SchedulerState::PickDonorLocked(int32_t rejoiner) const {
  for (int32_t r = 0; r < config_.num_workers; ++r) {
    const Node& d = workers_[static_cast<size_t>(r)];
    const RejoinWatcher& w = rejoin_watchers_[static_cast<size_t>(r)];
    if (r != rejoiner && d.registered && !d.dead && !d.exited && !d.preempted && w.incarnation > 0 &&
        w.incarnation == d.incarnation) {
      return r;
    }
  }
  return -1;
}

void SchedulerState::HandToDonorLocked(uint64_t id, Deferred* deferred) {
  const Rejoin& r = rejoins_.at(id);
  RejoinWatcher& w = rejoin_watchers_[static_cast<size_t>(r.donor)];
  if (w.waiting) {
    w.waiting = false;
    v1::WatchRejoinsResponse task;
    task.set_has_request(true);
    task.set_rejoin_id(id);
    task.set_rejoiner(r.rank);
    deferred->push_back([d = std::move(w.done), task] { d(task); });
    return;
  }
  // Ids of requests that expired or were replaced go; the queue stays within W.
  std::erase_if(w.queue, [&](uint64_t q) { return rejoins_.count(q) == 0; });
  w.queue.push_back(id);
}

void SchedulerState::RequestRejoin(const v1::RequestRejoinRequest& req, TimePoint deadline,
                                   Callback<v1::RequestRejoinResponse> done) {
  Deferred deferred;
  Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error = CheckNodeLocked(v1::ROLE_WORKER, req.rank(), /*must_be_registered=*/true);
    if (error.ok() && shutdown_) error = UnavailableError("scheduler is shutting down");
    if (error.ok() && failed_) error = AbortedError("job failed: " + failure_message_);
    const Node* n = error.ok() ? &NodeLocked(v1::ROLE_WORKER, req.rank()) : nullptr;
    if (error.ok() && req.incarnation() != n->incarnation) {
      error = FailedPreconditionError(
          "rejoin of worker " + std::to_string(req.rank()) + ": incarnation " +
          std::to_string(req.incarnation()) + " is not the current one (" +
          std::to_string(n->incarnation) + ")");
    }
    if (error.ok()) {
      // One request per rank: an older one belongs to an incarnation that died while rejoining.
      for (auto it = rejoins_.begin(); it != rejoins_.end();) {
        if (it->second.rank != req.rank()) {
          ++it;
          continue;
        }
        const Status st = AbortedError(
            RejoinLabel(it->first, it->second.rank, it->second.incarnation) +
            ": replaced by a newer request of the same worker");
        deferred.push_back([done = std::move(it->second.done), st] { done(st); });
        it = rejoins_.erase(it);
      }
      const int32_t donor = PickDonorLocked(req.rank());
      if (donor < 0 && recovering_) {
        // The donors may not have come back yet: not "fresh", which would lose the job's state.
        error = UnavailableError("rejoin of worker " + std::to_string(req.rank()) +
                                 ": the scheduler restarted and no donor is back yet; ask again");
      } else if (donor < 0) {
        ++stats_.fresh_rejoins;
        TLOG_INFO << "worker " << req.rank() << " (incarnation " << req.incarnation()
                  << ") asks to rejoin; no live worker has committed a step: it starts fresh";
        v1::RequestRejoinResponse resp;
        resp.set_fresh(true);
        deferred.push_back([done = std::move(done), resp] { done(resp); });
      } else {
        const uint64_t id = next_rejoin_id_++;
        TLOG_INFO << RejoinLabel(id, req.rank(), req.incarnation()) << ": donor worker "
                  << donor;
        rejoins_[id] = Rejoin{req.rank(), req.incarnation(), donor, clock_->Now(), deadline,
                              std::move(done)};
        HandToDonorLocked(id, &deferred);
      }
    }
  }
  Run(deferred);
  if (!error.ok()) done(error);
}

void SchedulerState::WatchRejoins(const v1::WatchRejoinsRequest& req, TimePoint deadline,
                                  Callback<v1::WatchRejoinsResponse> done) {
  Deferred deferred;
  Status error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    error = CheckNodeLocked(v1::ROLE_WORKER, req.rank(), /*must_be_registered=*/true);
    if (error.ok() && shutdown_) error = UnavailableError("scheduler is shutting down");
    const Node* n = error.ok() ? &NodeLocked(v1::ROLE_WORKER, req.rank()) : nullptr;
    if (error.ok() && req.incarnation() != n->incarnation) {
      error = FailedPreconditionError(
          "rejoin watcher of worker " + std::to_string(req.rank()) + ": incarnation " +
          std::to_string(req.incarnation()) + " is not the current one (" +
          std::to_string(n->incarnation) + ")");
    }
    if (error.ok()) {
      RejoinWatcher& w = rejoin_watchers_[static_cast<size_t>(req.rank())];
      w.incarnation = req.stop() ? 0 : req.incarnation();
      if (w.waiting) {  // a poll its client gave up on, or the one a stop call ends
        w.waiting = false;
        deferred.push_back([d = std::move(w.done)] { d(v1::WatchRejoinsResponse()); });
      }
      if (req.stop()) {
        // Requests queued for this worker go to the next donor, or learn that there is none.
        std::vector<uint64_t> queued = std::move(w.queue);
        w.queue.clear();
        for (uint64_t id : queued) {
          auto it = rejoins_.find(id);
          if (it == rejoins_.end()) continue;
          const int32_t donor = PickDonorLocked(it->second.rank);
          if (donor >= 0) {
            it->second.donor = donor;
            HandToDonorLocked(id, &deferred);
            continue;
          }
          const Status st = AbortedError(
              RejoinLabel(id, it->second.rank, it->second.incarnation) + ": donor worker " +
              std::to_string(req.rank()) + " stopped (its training ended) and no other live "
              "worker has committed a step");
          deferred.push_back([done = std::move(it->second.done), st] { done(st); });
          rejoins_.erase(it);
        }
      }
      v1::WatchRejoinsResponse task;
      while (!w.queue.empty() && !task.has_request()) {
        const uint64_t id = w.queue.front();
        w.queue.erase(w.queue.begin());
        auto it = rejoins_.find(id);
        if (it == rejoins_.end()) continue;  // expired or replaced meanwhile
        task.set_has_request(true);
        task.set_rejoin_id(id);
        task.set_rejoiner(it->second.rank);
      }
      if (task.has_request() || !req.wait()) {
        deferred.push_back([done = std::move(done), task] { done(task); });
      } else {
        w.waiting = true;
        w.deadline = deadline;
        w.done = std::move(done);
      }
    }
  }
  if (!error.ok()) {
    done(error);
    return;
  }
  Run(deferred);
}

Status SchedulerState::RejoinServed(const v1::RejoinServedRequest& req) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rejoins_.find(req.rejoin_id());
    if (it == rejoins_.end()) {
      return NotFoundError("rejoin " + std::to_string(req.rejoin_id()) +
                           " is not pending (its deadline passed, or a newer request of the "
                           "same worker replaced it)");
    }
    Rejoin& r = it->second;
    if (req.donor() != r.donor) {
      return InvalidArgumentError(RejoinLabel(it->first, r.rank, r.incarnation) +
                                  " was handed to worker " + std::to_string(r.donor) +
                                  ", not worker " + std::to_string(req.donor()));
    }
    const std::string label = RejoinLabel(it->first, r.rank, r.incarnation);
    if (!req.error().empty()) {
      const Status st = AbortedError(label + ": donor worker " + std::to_string(r.donor) +
                                     " could not serve it: " + req.error());
      TLOG_WARN << st.message();
      deferred.push_back([done = std::move(r.done), st] { done(st); });
    } else {
      v1::RequestRejoinResponse resp;
      resp.set_rejoin_id(it->first);
      resp.set_donor(r.donor);
      resp.set_step(req.step());
      *resp.mutable_key_steps() = req.key_steps();
      ++stats_.rejoins;
      TLOG_INFO << label << ": donor worker " << r.donor << " stashed step " << req.step();
      deferred.push_back([done = std::move(r.done), resp = std::move(resp)] { done(resp); });
    }
    rejoins_.erase(it);
  }
  Run(deferred);
  return Status::Ok();
}

void SchedulerState::SweepRejoinsLocked(TimePoint now, Deferred* deferred) {
  for (auto& w : rejoin_watchers_) {
    if (w.waiting && w.deadline <= now) {
      w.waiting = false;
      deferred->push_back([d = std::move(w.done)] { d(v1::WatchRejoinsResponse()); });
    }
  }
  for (auto it = rejoins_.begin(); it != rejoins_.end();) {
    const Rejoin& r = it->second;
    if (r.deadline > now) {
      ++it;
      continue;
    }
    const Status st = DeadlineExceededError(
        RejoinLabel(it->first, r.rank, r.incarnation) + ": donor worker " +
        std::to_string(r.donor) + " did not stash its last commit within " +
        std::to_string(static_cast<int64_t>(Seconds(now - r.arrived) * 1000)) +
        " ms (is it still running? its log says why)");
    TLOG_WARN << st.message();
    deferred->push_back([done = std::move(it->second.done), st] { done(st); });
    it = rejoins_.erase(it);
  }
}

void SchedulerState::FailRejoinsLocked(const Status& status, Deferred* deferred) {
  for (auto& w : rejoin_watchers_) {
    if (!w.waiting) continue;
    w.waiting = false;
    deferred->push_back([d = std::move(w.done), status] { d(status); });
  }
  for (auto& [id, r] : rejoins_) {
    deferred->push_back([done = std::move(r.done), status] { done(status); });
  }
  rejoins_.clear();
}

SchedulerState::TimePoint SchedulerState::NextRejoinDeadlineLocked() const {
  TimePoint next = TimePoint::max();
  for (const auto& w : rejoin_watchers_) {
    if (w.waiting) next = std::min(next, w.deadline);
  }
  for (const auto& [id, r] : rejoins_) next = std::min(next, r.deadline);
  return next;
}

size_t SchedulerState::RejoinWaitersLocked() const {
  size_t n = rejoins_.size();
  for (const auto& w : rejoin_watchers_) n += w.waiting ? 1 : 0;
  return n;
}

}  // namespace trellis
