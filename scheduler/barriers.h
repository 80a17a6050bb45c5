// Named barriers with client-side generations: generation g of barrier `name` is released once
// every member (the workers; with all_nodes, the servers too) arrived at g. An arrival at a
// generation already released passes at once (a restarted process catching up).
//
// Not thread-safe: SchedulerState calls it with its one lock held. Replies go into the caller's
// Deferred, to run once the lock is released.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "scheduler/deferred.h"
#include "scheduler/membership.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class Barriers {
 public:
  using TimePoint = Clock::TimePoint;

  static constexpr size_t kMaxBarriers = 10000;

  // The request's own fields (name 1..256 characters, generation >= 0).
  static Status CheckRequest(const v1::BarrierRequest& req);
  // An arrival. `restarted`: this scheduler restarted and lost the count, so an arrival ahead
  // of the next generation to release proves that every member passed those before it.
  // REQUIRES: CheckRequest(req).ok(); the caller checked the member, the job and shutdown.
  void Arrive(const v1::BarrierRequest& req, TimePoint deadline, Reply<v1::BarrierResponse> done,
              const Membership& members, bool restarted, TimePoint now, Deferred* deferred);

  // Waiters past their deadline fail, naming who did not arrive.
  void Sweep(TimePoint now, const Membership& members, Deferred* deferred);
  // Every waiter fails with `status` (the job failed; shutdown).
  void FailAll(const Status& status, Deferred* deferred);
  TimePoint NextDeadline() const;
  size_t waiters() const;
  void AddTo(SchedulerStats* stats) const;

 private:
  struct Waiter {
    v1::Role role;
    int32_t rank;
    TimePoint arrived;
    TimePoint deadline;
    Reply<v1::BarrierResponse> done;
  };
  struct Group {
    bool all_nodes = false;
    int64_t released = 0;  // generations 0..released-1 are released
    std::set<std::pair<int, int32_t>> arrived;  // (role, rank) at generation `released`
    std::vector<Waiter> waiters;
  };
  static size_t Members(const Group& g, const Membership& members);

  std::map<std::string, Group> groups_;
  int64_t releases_ = 0;        // generations released
  double wait_seconds_ = 0;     // summed over every released waiter
};

}  // namespace trellis
