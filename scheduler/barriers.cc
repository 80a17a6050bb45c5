#include "scheduler/barriers.h"

#include <algorithm>

#include "common/base/logging.h"

namespace trellis {

Status Barriers::CheckRequest(const v1::BarrierRequest& req) {
  if (req.name().empty() || req.name().size() > 256) {
    return InvalidArgumentError("barrier name must be 1 to 256 characters, got " +
                                std::to_string(req.name().size()));
  }
  if (req.generation() < 0) {
    return InvalidArgumentError("barrier \"" + req.name() + "\": generation must be >= 0, got " +
                                std::to_string(req.generation()));
  }
  return Status::Ok();
}

size_t Barriers::Members(const Group& g, const Membership& members) {
  return static_cast<size_t>(members.WorldWorkers()) +
         (g.all_nodes ? static_cast<size_t>(members.size(v1::ROLE_SERVER)) : 0);
}

void Barriers::Arrive(const v1::BarrierRequest& req, TimePoint deadline,
                      Reply<v1::BarrierResponse> done, const Membership& members, bool restarted,
                      TimePoint now, Deferred* deferred) {
  Status st;
  if (!req.all_nodes() && req.role() == v1::ROLE_SERVER) {
    st = InvalidArgumentError("barrier \"" + req.name() + "\" without all_nodes waits for " +
                              "workers only; server " + std::to_string(req.rank()) +
                              " cannot join it");
  }
  if (st.ok() && groups_.count(req.name()) == 0 && groups_.size() >= kMaxBarriers) {
    st = ResourceExhaustedError("too many barrier names (" + std::to_string(kMaxBarriers) + ")");
  }
  Group* g = nullptr;
  if (st.ok()) {
    auto [it, inserted] = groups_.try_emplace(req.name());
    g = &it->second;
    if (inserted) {
      g->all_nodes = req.all_nodes();
    } else if (g->all_nodes != req.all_nodes()) {
      st = InvalidArgumentError("barrier \"" + req.name() + "\" was first used with all_nodes=" +
                                (g->all_nodes ? "true" : "false") + ", now called with " +
                                (req.all_nodes() ? "true" : "false"));
    }
  }
  if (st.ok() && req.generation() > g->released && restarted) {
    // This scheduler restarted and lost the count: an arrival at g proves that every member
    // passed the generations before g. Those waiting at an older one were released then
    // (the answer died with the old scheduler).
    for (auto& w : g->waiters) {
      deferred->push_back([done = std::move(w.done)] { done(v1::BarrierResponse()); });
    }
    g->waiters.clear();
    g->arrived.clear();
    g->released = req.generation();
  }
  if (st.ok() && req.generation() > g->released) {
    st = FailedPreconditionError("barrier \"" + req.name() + "\": generation " +
                                 std::to_string(req.generation()) +
                                 " is ahead of the next one to release (" +
                                 std::to_string(g->released) + ")");
  }
  if (!st.ok()) {
    deferred->push_back([done = std::move(done), st] { done(st); });
    return;
  }
  if (req.generation() < g->released) {  // already released: a restarted process catching up
    deferred->push_back([done = std::move(done)] { done(v1::BarrierResponse()); });
    return;
  }
  g->arrived.insert({static_cast<int>(req.role()), req.rank()});
  g->waiters.push_back({req.role(), req.rank(), now, deadline, std::move(done)});
  if (g->arrived.size() == Members(*g, members)) {
    TLOG_DEBUG << "barrier \"" << req.name() << "\" generation " << g->released << " released";
    ++g->released;
    ++releases_;
    g->arrived.clear();
    for (auto& w : g->waiters) {
      v1::BarrierResponse resp;
      resp.set_waited_seconds(Seconds(now - w.arrived));
      wait_seconds_ += resp.waited_seconds();
      deferred->push_back([done = std::move(w.done), resp] { done(resp); });
    }
    g->waiters.clear();
  }
}

void Barriers::Sweep(TimePoint now, const Membership& members, Deferred* deferred) {
  for (auto& named : groups_) {
    const std::string& name = named.first;  // not a structured binding: clang 14 cannot
    auto& g = named.second;                 // capture one in a lambda
    auto bit = std::partition(g.waiters.begin(), g.waiters.end(),
                              [&](const Waiter& w) { return w.deadline > now; });
    if (bit == g.waiters.end()) continue;
    std::string missing;
    int listed = 0;
    auto note = [&](v1::Role role) {
      for (int32_t r = 0; r < members.size(role) && listed < 10; ++r) {
        if (g.arrived.count({static_cast<int>(role), r}) != 0) continue;
        missing += (listed++ == 0 ? "" : ", ") + std::string(RoleName(role)) + " " +
                   std::to_string(r);
      }
    };
    note(v1::ROLE_WORKER);
    if (g.all_nodes) note(v1::ROLE_SERVER);
    const Status st = DeadlineExceededError(
        "barrier \"" + name + "\" generation " + std::to_string(g.released) + ": " +
        std::to_string(g.arrived.size()) + " of " + std::to_string(Members(g, members)) +
        " arrived; waiting for " + missing);
    for (auto w = bit; w != g.waiters.end(); ++w) {
      deferred->push_back([done = std::move(w->done), st] { done(st); });
    }
    g.waiters.erase(bit, g.waiters.end());
  }
}

void Barriers::FailAll(const Status& status, Deferred* deferred) {
  for (auto& named : groups_) {
    for (auto& w : named.second.waiters) {
      deferred->push_back([done = std::move(w.done), status] { done(status); });
    }
    named.second.waiters.clear();
  }
}

Barriers::TimePoint Barriers::NextDeadline() const {
  TimePoint next = TimePoint::max();
  for (const auto& named : groups_) {
    for (const auto& w : named.second.waiters) next = std::min(next, w.deadline);
  }
  return next;
}

size_t Barriers::waiters() const {
  size_t n = 0;
  for (const auto& named : groups_) n += named.second.waiters.size();
  return n;
}

void Barriers::AddTo(SchedulerStats* stats) const {
  stats->barrier_releases += releases_;
  stats->barrier_wait_seconds += wait_seconds_;
}

}  // namespace trellis
