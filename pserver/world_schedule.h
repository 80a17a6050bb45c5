// Which workers take part in each step: the foundation of elastic jobs on the server
// (docs/elastic.md).
//
// A job starts with workers 0..W-1: world epoch 0. When a resize takes effect, every worker of
// the new world tells every server (wire::Op::kWorld, the epoch in the header's step field)
// at the step boundary where it switches, and waits for the answer before its next push. At
// that moment no worker has pushed the next step of any slice (the scheduler chose the boundary
// so: scheduler/world_plan.h), so the server gives every slice the new world from its next step
// on: the step completes with every member's push, the update-mode mean divides by the member
// count, and a push from a worker outside it is refused. Each slice holds its own world because
// slices count steps on their own (a key declared late, deferred init, starts at step 1 later).
//
// Workers are named here by their slot, which stays the same for a worker's life in the job
// ([0, slots), the rank its data streams say hello with); a program's dense rank among the
// members is the worker's business.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"

namespace trellis {

struct World {
  int64_t epoch = 0;
  std::vector<bool> members;  // per slot
  int32_t size = 0;           // how many members

  bool Has(int32_t slot) const {
    return slot >= 0 && static_cast<size_t>(slot) < members.size() && members[slot];
  }
  // "world 2 {0, 2, 3}"
  std::string Describe() const;
};

class WorldSchedule {
 public:
  // Epoch 0: workers 0..initial-1. REQUIRES: 1 <= initial <= slots.
  WorldSchedule(int32_t slots, int32_t initial);
  WorldSchedule(const WorldSchedule&) = delete;
  WorldSchedule& operator=(const WorldSchedule&) = delete;

  int32_t slots() const { return slots_; }

  // The newest world: what a slice made now starts with. Never null.
  std::shared_ptr<const World> Current() const EXCLUDES(mu_);

  // The world `epoch` of `members`, checked: INVALID_ARGUMENT for a slot out of [0, slots), a
  // slot named twice, no member, a negative epoch.
  StatusOr<std::shared_ptr<const World>> Make(int64_t epoch,
                                              const std::vector<int32_t>& members) const;
  // Whether `world` is the current one (every member announces it: the repeats change nothing).
  bool IsCurrent(const World& world) const EXCLUDES(mu_);
  // `world` becomes the current one. FAILED_PRECONDITION unless its epoch is newer (a stale or
  // crossed announcement).
  Status Advance(std::shared_ptr<const World> world) EXCLUDES(mu_);

 private:
  const int32_t slots_;
  mutable Mutex mu_;
  std::shared_ptr<const World> current_ GUARDED_BY(mu_);
};

}  // namespace trellis
