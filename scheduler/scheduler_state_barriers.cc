// SchedulerState: named barriers with client-side generations.
#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/shard_map.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

void SchedulerState::Barrier(const v1::BarrierRequest& req, TimePoint deadline,
                             Callback<v1::BarrierResponse> done) {
  if (req.name().empty() || req.name().size() > 256) {
    done(InvalidArgumentError("barrier name must be 1 to 256 characters, got " +
                              std::to_string(req.name().size())));
    return;
  }
  if (req.generation() < 0) {
    done(InvalidArgumentError("barrier \"" + req.name() + "\": generation must be >= 0, got " +
                              std::to_string(req.generation())));
    return;
  }
  Deferred deferred;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Status st = CheckNodeLocked(req.role(), req.rank(), true);
    if (st.ok() && shutdown_) st = UnavailableError("scheduler is shutting down");
    if (st.ok() && failed_) st = AbortedError("job failed: " + failure_message_);
    if (st.ok() && !req.all_nodes() && req.role() == v1::ROLE_SERVER) {
      st = InvalidArgumentError("barrier \"" + req.name() + "\" without all_nodes waits for " +
                                "workers only; server " + std::to_string(req.rank()) +
                                " cannot join it");
    }
    constexpr size_t kMaxBarriers = 10000;
    if (st.ok() && barriers_.count(req.name()) == 0 && barriers_.size() >= kMaxBarriers) {
      st = ResourceExhaustedError("too many barrier names (" + std::to_string(kMaxBarriers) + ")");
    }
    BarrierGroup* g = nullptr;
    if (st.ok()) {
      auto [it, inserted] = barriers_.try_emplace(req.name());
      g = &it->second;
      if (inserted) {
        g->all_nodes = req.all_nodes();
      } else if (g->all_nodes != req.all_nodes()) {
        st = InvalidArgumentError("barrier \"" + req.name() + "\" was first used with all_nodes=" +
                                  (g->all_nodes ? "true" : "false") + ", now called with " +
                                  (req.all_nodes() ? "true" : "false"));
      }
    }
    if (st.ok() && req.generation() > g->released && restarted_) {
      // This scheduler restarted and lost the count: an arrival at g proves that every member
      // passed the generations before g. Those waiting at an older one were released then
      // (the answer died with the old scheduler).
      for (auto& w : g->waiters) deferred.push_back([done = std::move(w.done)] { done(v1::BarrierResponse()); });
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
      lock.unlock();
      done(st);
      return;
    }
    if (req.generation() < g->released) {  // already released: a restarted process catching up
      lock.unlock();
      done(v1::BarrierResponse());
      return;
    }
    const TimePoint now = clock_->Now();
    g->arrived.insert({static_cast<int>(req.role()), req.rank()});
    g->waiters.push_back({req.role(), req.rank(), now, deadline, std::move(done)});
    const size_t members = static_cast<size_t>(config_.num_workers) +
                           (g->all_nodes ? static_cast<size_t>(config_.num_servers) : 0);
    if (g->arrived.size() == members) {
      TLOG_DEBUG << "barrier \"" << req.name() << "\" generation " << g->released << " released";
      ++g->released;
      ++stats_.barrier_releases;
      g->arrived.clear();
      for (auto& w : g->waiters) {
        v1::BarrierResponse resp;
        resp.set_waited_seconds(Seconds(now - w.arrived));
        stats_.barrier_wait_seconds += resp.waited_seconds();
        deferred.push_back([done = std::move(w.done), resp] { done(resp); });
      }
      g->waiters.clear();
    }
  }
  Run(deferred);
}

}  // namespace trellis
