// Local groups' bootstrap keys: the NCCL unique id a multi-GPU pod's local rank 0 hands to the
// pod's other processes through the scheduler. Publishing overwrites the group's key and
// answers its waiters; a Get answers once the key is there, or DEADLINE_EXCEEDED at its
// deadline. Names 1..256 characters, keys 1..kMaxKeyBytes; at most kMaxKeys groups, the oldest
// published one without waiters making room for a new one.
//
// Not thread-safe: SchedulerState calls it with its one lock held. Replies go into the caller's
// Deferred, to run once the lock is released.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "scheduler/deferred.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class GroupKeys {
 public:
  using TimePoint = Clock::TimePoint;

  static constexpr size_t kMaxKeyBytes = 1024;
  static constexpr size_t kMaxKeys = 4096;

  // The requests' own fields.
  static Status CheckGroupName(const std::string& group);
  static Status CheckRequest(const v1::PublishGroupKeyRequest& req);

  // REQUIRES: CheckRequest(req).ok().
  Status Publish(const v1::PublishGroupKeyRequest& req, Deferred* deferred);
  // REQUIRES: CheckGroupName(req.group()).ok().
  void Get(const v1::GetGroupKeyRequest& req, TimePoint deadline, Reply<std::string> done,
           TimePoint now, Deferred* deferred);

  // Waiters past their deadline fail; names nobody published and nobody waits for go.
  void Sweep(TimePoint now, Deferred* deferred);
  void FailAll(const Status& status, Deferred* deferred);
  TimePoint NextDeadline() const;
  size_t waiters() const;

 private:
  struct Waiter {
    TimePoint arrived;
    TimePoint deadline;
    Reply<std::string> done;
  };
  struct Group {
    bool published = false;
    std::string key;
    uint64_t published_seq = 0;  // publication order, for choosing what to evict
    std::vector<Waiter> waiters;
  };
  // Room for one more group name: evicts the oldest published key without waiters.
  Status MakeRoom();

  std::unordered_map<std::string, Group> groups_;
  uint64_t seq_ = 0;
};

}  // namespace trellis
