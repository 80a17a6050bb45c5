// A restarted worker rejoining the running job (docs/checkpoints.md#crash-recovery-workers;
// proto: RequestRejoin, WatchRejoins, RejoinServed). The scheduler only matches a rejoiner with
// a donor and relays the donor's answer; the data travels through the parameter servers
// (kStash / kFetch). The donor is the lowest-rank live worker watching under its current
// incarnation, other than the rejoiner; none: answered `fresh` at once while no worker has ever
// watched (the job's training has not begun), else the job has lost its model with every worker
// and the request fails the job (runPolicy.failurePolicy says what follows). A request waits for its
// donor's RejoinServed until its deadline (then DEADLINE_EXCEEDED naming the donor); one
// request per rank is kept (a newer one fails the older with ABORTED), so the state is bounded
// by the number of workers.
//
// Not thread-safe: SchedulerState calls it with its one lock held. Replies go into the caller's
// Deferred, to run once the lock is released.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "scheduler/deferred.h"
#include "scheduler/membership.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class Rejoins {
 public:
  using TimePoint = Clock::TimePoint;

  explicit Rejoins(int32_t num_workers) : watchers_(static_cast<size_t>(num_workers)) {}

  // A rejoin request. `recovering`: the scheduler restarted and the donors may not be back yet
  // (UNAVAILABLE instead of `fresh`, which would lose the job's state). No donor once training
  // has begun: every worker that held the model is gone, so in-job recovery cannot heal the
  // job: `*job_failure` says why (the caller fails the job) and the request gets ABORTED.
  // REQUIRES: the caller checked the worker (registered), the job (not failed) and shutdown.
  void Request(const v1::RequestRejoinRequest& req, TimePoint deadline,
                 Reply<v1::RequestRejoinResponse> done, const Membership& members,
                 bool recovering, TimePoint now, Deferred* deferred, std::string* job_failure);
  // A donor's long poll; `stop` ends its watch (its queued requests go to the next donor).
  // REQUIRES: the caller checked the worker (registered) and shutdown.
  void Watch(const v1::WatchRejoinsRequest& req, TimePoint deadline,
               Reply<v1::WatchRejoinsResponse> done, const Membership& members,
               Deferred* deferred);
  Status Served(const v1::RejoinServedRequest& req, Deferred* deferred);
  // Rejoin ids tag stashes on the servers; after a scheduler restart the old scheduler's ids may
  // still be there, so ids continue from `next`.
  void RestartIdsAt(uint64_t next) { next_id_ = next; }

  // Requests past their deadline fail; watchers' polls past theirs are answered empty.
  void Sweep(TimePoint now, Deferred* deferred);
  void FailAll(const Status& status, Deferred* deferred);
  TimePoint NextDeadline() const;
  size_t waiters() const;
  void AddTo(SchedulerStats* stats) const;

 private:
  // A worker's rejoin watcher (index = rank). `incarnation` 0: never watched.
  struct Watcher {
    int64_t incarnation = 0;
    bool waiting = false;  // a WatchRejoins long poll is parked here
    TimePoint deadline{};
    Reply<v1::WatchRejoinsResponse> done;
    std::vector<uint64_t> queue;  // rejoin ids handed to this donor, not yet polled
  };
  struct Rejoin {
    int32_t rank = 0;
    int64_t incarnation = 0;
    int32_t donor = 0;
    TimePoint arrived{};
    TimePoint deadline{};
    Reply<v1::RequestRejoinResponse> done;
  };

  // The lowest-rank live worker watching under its current incarnation, other than `rejoiner`;
  // -1: none.
  int32_t PickDonor(int32_t rejoiner, const Membership& members) const;
  // Hands rejoin `id` to its donor's parked poll, or queues it for the donor's next poll.
  void HandToDonor(uint64_t id, Deferred* deferred);

  std::vector<Watcher> watchers_;  // index = worker rank
  std::map<uint64_t, Rejoin> rejoins_;  // at most one per rank
  uint64_t next_id_ = 1;
  bool began_ = false;  // some worker has watched: its first step is committed, training began
  int64_t served_ = 0;  // rejoin requests served by a donor
  int64_t fresh_ = 0;   // rejoin requests answered "start fresh"
};

}  // namespace trellis
