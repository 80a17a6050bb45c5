#include "scheduler/rejoins.h"

#include <algorithm>

#include "common/base/logging.h"

namespace trellis {

namespace {

// "rejoin 3 of worker 1 (incarnation 2)"
std::string RejoinLabel(uint64_t id, int32_t rank, int64_t incarnation) {
  return "rejoin " + std::to_string(id) + " of worker " + std::to_string(rank) +
         " (incarnation " + std::to_string(incarnation) + ")";
}

}  // namespace

int32_t Rejoins::PickDonor(int32_t rejoiner, const Membership& members) const {
  for (int32_t r = 0; r < static_cast<int32_t>(watchers_.size()); ++r) {
    const Watcher& w = watchers_[static_cast<size_t>(r)];
    if (r != rejoiner && members.Live(v1::ROLE_WORKER, r) && w.incarnation > 0 &&
        w.incarnation == members.at(v1::ROLE_WORKER, r).incarnation) {
      return r;
    }
  }
  return -1;
}

void Rejoins::HandToDonor(uint64_t id, Deferred* deferred) {
  const Rejoin& r = rejoins_.at(id);
  Watcher& w = watchers_[static_cast<size_t>(r.donor)];
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

void Rejoins::Request(const v1::RequestRejoinRequest& req, TimePoint deadline,
                        Reply<v1::RequestRejoinResponse> done, const Membership& members,
                        bool recovering, TimePoint now, Deferred* deferred,
                        std::string* job_failure) {
  const int64_t current = members.at(v1::ROLE_WORKER, req.rank()).incarnation;
  if (req.incarnation() != current) {
    deferred->push_back([done = std::move(done),
                         st = FailedPreconditionError(
                             "rejoin of worker " + std::to_string(req.rank()) + ": incarnation " +
                             std::to_string(req.incarnation()) + " is not the current one (" +
                             std::to_string(current) + ")")] { done(st); });
    return;
  }
  // One request per rank: an older one belongs to an incarnation that died while rejoining.
  for (auto it = rejoins_.begin(); it != rejoins_.end();) {
    if (it->second.rank != req.rank()) {
      ++it;
      continue;
    }
    const Status st = AbortedError(RejoinLabel(it->first, it->second.rank,
                                               it->second.incarnation) +
                                   ": replaced by a newer request of the same worker");
    deferred->push_back([done = std::move(it->second.done), st] { done(st); });
    it = rejoins_.erase(it);
  }
  const int32_t donor = PickDonor(req.rank(), members);
  if (donor < 0 && recovering) {
    // The donors may not have come back yet: not "fresh", which would lose the job's state.
    // Replied after the replaced requests above.
    deferred->push_back([done = std::move(done),
                         st = UnavailableError("rejoin of worker " + std::to_string(req.rank()) +
                                               ": the scheduler restarted and no donor is back "
                                               "yet; ask again")] { done(st); });
    return;
  }
  if (donor < 0 && began_) {
    // The servers are past the steps a fresh start would begin with (its broadcast of step 0
    // would be refused), and no live worker holds the model to hand over.
    *job_failure = "worker " + std::to_string(req.rank()) + " (incarnation " +
                   std::to_string(req.incarnation()) +
                   ") asks to rejoin, but every worker that held the model is gone (all lost at "
                   "once): in-job recovery cannot heal this, only a restart of the whole job from "
                   "its newest checkpoint can (runPolicy.failurePolicy: RestartJob)";
    deferred->push_back([done = std::move(done), st = AbortedError(*job_failure)] { done(st); });
    return;
  }
  if (donor < 0) {
    ++fresh_;
    TLOG_INFO << "worker " << req.rank() << " (incarnation " << req.incarnation()
              << ") asks to rejoin; no live worker has committed a step: it starts fresh";
    v1::RequestRejoinResponse resp;
    resp.set_fresh(true);
    deferred->push_back([done = std::move(done), resp] { done(resp); });
    return;
  }
  const uint64_t id = next_id_++;
  TLOG_INFO << RejoinLabel(id, req.rank(), req.incarnation()) << ": donor worker " << donor;
  rejoins_[id] = Rejoin{req.rank(), req.incarnation(), donor, now, deadline, std::move(done)};
  HandToDonor(id, deferred);
}

void Rejoins::Watch(const v1::WatchRejoinsRequest& req, TimePoint deadline,
                      Reply<v1::WatchRejoinsResponse> done, const Membership& members,
                      Deferred* deferred) {
  const int64_t current = members.at(v1::ROLE_WORKER, req.rank()).incarnation;
  if (req.incarnation() != current) {
    deferred->push_back([done = std::move(done),
                         st = FailedPreconditionError(
                             "rejoin watcher of worker " + std::to_string(req.rank()) +
                             ": incarnation " + std::to_string(req.incarnation()) +
                             " is not the current one (" + std::to_string(current) + ")")] {
      done(st);
    });
    return;
  }
  Watcher& w = watchers_[static_cast<size_t>(req.rank())];
  w.incarnation = req.stop() ? 0 : req.incarnation();
  began_ = began_ || !req.stop();
  if (w.waiting) {  // a poll its client gave up on, or the one a stop call ends
    w.waiting = false;
    deferred->push_back([d = std::move(w.done)] { d(v1::WatchRejoinsResponse()); });
  }
  if (req.stop()) {
    // Requests queued for this worker go to the next donor, or learn that there is none.
    std::vector<uint64_t> queued = std::move(w.queue);
    w.queue.clear();
    for (uint64_t id : queued) {
      auto it = rejoins_.find(id);
      if (it == rejoins_.end()) continue;
      const int32_t donor = PickDonor(it->second.rank, members);
      if (donor >= 0) {
        it->second.donor = donor;
        HandToDonor(id, deferred);
        continue;
      }
      const Status st = AbortedError(
          RejoinLabel(id, it->second.rank, it->second.incarnation) + ": donor worker " +
          std::to_string(req.rank()) + " stopped (its training ended) and no other live "
          "worker has committed a step");
      deferred->push_back([done = std::move(it->second.done), st] { done(st); });
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
    deferred->push_back([done = std::move(done), task] { done(task); });
  } else {
    w.waiting = true;
    w.deadline = deadline;
    w.done = std::move(done);
  }
}

Status Rejoins::Served(const v1::RejoinServedRequest& req, Deferred* deferred) {
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
    deferred->push_back([done = std::move(r.done), st] { done(st); });
  } else {
    v1::RequestRejoinResponse resp;
    resp.set_rejoin_id(it->first);
    resp.set_donor(r.donor);
    resp.set_step(req.step());
    *resp.mutable_key_steps() = req.key_steps();
    ++served_;
    TLOG_INFO << label << ": donor worker " << r.donor << " stashed step " << req.step();
    deferred->push_back([done = std::move(r.done), resp = std::move(resp)] { done(resp); });
  }
  rejoins_.erase(it);
  return Status::Ok();
}

void Rejoins::Sweep(TimePoint now, Deferred* deferred) {
  for (auto& w : watchers_) {
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

void Rejoins::FailAll(const Status& status, Deferred* deferred) {
  for (auto& w : watchers_) {
    if (!w.waiting) continue;
    w.waiting = false;
    deferred->push_back([d = std::move(w.done), status] { d(status); });
  }
  for (auto& [id, r] : rejoins_) {
    deferred->push_back([done = std::move(r.done), status] { done(status); });
  }
  rejoins_.clear();
}

Rejoins::TimePoint Rejoins::NextDeadline() const {
  TimePoint next = TimePoint::max();
  for (const auto& w : watchers_) {
    if (w.waiting) next = std::min(next, w.deadline);
  }
  for (const auto& [id, r] : rejoins_) next = std::min(next, r.deadline);
  return next;
}

size_t Rejoins::waiters() const {
  size_t n = rejoins_.size();
  for (const auto& w : watchers_) n += w.waiting ? 1 : 0;
  return n;
}

void Rejoins::AddTo(SchedulerStats* stats) const {
  stats->rejoins += served_;
  stats->fresh_rejoins += fresh_;
}

}  // namespace trellis

