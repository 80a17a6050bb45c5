// Elastic jobs on the worker (docs/elastic.md; the scheduler's side is scheduler/world_plan.h).
//
// Once the scheduler's pings say a resize is under way, the worker reports the last step boundary
// it passed (Checkpointer::Commit of step s: the tensors hold the values after s and no push of
// s+1 started) to the scheduler (ReachStep), without waiting: at its next boundary if it gets
// there first, else from the pings' thread (OnAnnounced) -- a worker stuck inside a step, waiting
// for a peer that waits for the decision, must still report. From the boundary after its report
// on it waits for the decision, which names the new world's members and its first step F (the
// furthest report + 2, scheduler/world_plan.h). At the boundary of F-1 the worker switches: a
// member tells every server the world (wire::Op::kWorld) and waits for their answers, so no
// server counts a push of F against the old world, then takes its new rank (its index among the
// members); a worker left out stops there: its operations are refused from then on and the
// program ends (exit 0).
//
// A server resize is a new world too, with the same members and another server count: its
// decision carries the shard map of the new servers and their addresses, and at the boundary of
// F-1 each member moves the slices to their new owners (Hooks::move_servers: every worker moves
// every moved slice, pserver/slice_handover.h) before it tells the servers the world.
//
// Growing (scheduler/world_plan.h): a worker whose slot is outside the world it starts in asks
// to join (Join, at its creation) and waits for the decision; named in the new world, it takes
// the members' commit of the step before F through the rejoin path (Checkpointer::Restore), and
// only then tells the servers the world (AnnounceJoined): that commit means every slice finished
// step F-1, so no server counts a push of F-1 against the new world.
//
// Thread-safe: the boundary runs on the training thread, OnAnnounced on the pings' thread,
// rank() and view() anywhere. No lock is held across a call to the scheduler or the servers.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "trellis/trellis.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class WorldSwitch {
 public:
  struct Hooks {
    // The resize the scheduler says is under way (0: none). Null: the world never changes.
    std::function<int64_t()> resize_epoch;
    // The scheduler's ReachStep (with wait, bounded by the duration).
    std::function<StatusOr<v1::ReachStepResponse>(const v1::ReachStepRequest&,
                                                  std::chrono::milliseconds)>
        reach_step;
    // Tells every server world `epoch` of `members` (wire::Op::kWorld) and waits for them.
    std::function<Status(int64_t epoch, const std::vector<int32_t>& members)> announce;
    // A server resize at its boundary: the servers of `addresses` switch to `map` and every
    // moved slice goes to its new owner. Null: a server resize is refused.
    std::function<Status(const v1::ShardMap& map, const std::vector<std::string>& addresses)>
        move_servers;
  };

  // `slot`: this worker's rank for its life in the job. `initial`: the world it starts in (no
  // members: 0..num_workers-1 from step 1). `wait`: how long a boundary waits for a decision
  // before it fails (the operation timeout).
  WorldSwitch(int32_t slot, int64_t incarnation, int32_t num_workers, const v1::WorldInfo& initial,
              Hooks hooks, std::chrono::milliseconds wait);

  // A worker outside the world it starts in (view().left): asks to join the grow under way and
  // waits for its decision (at most the operation timeout). Not wanted (no grow, a scheduler
  // that gave it up): it stays left, OK. Errors: the scheduler could not be asked.
  Status Join() EXCLUDES(mu_);
  // The first step of the world this worker joined (0: it did not join one).
  int64_t joined_from() const EXCLUDES(mu_);
  // A joiner holding the members' commit of joined_from()-1: tells every server its world.
  Status AnnounceJoined() EXCLUDES(mu_);
  // The boundary after `step`. OK also when this worker just left the world (view().left).
  Status AtBoundary(int64_t step) EXCLUDES(mu_);
  // The pings say resize `epoch` is under way: report the last boundary passed, if not yet.
  void OnAnnounced(int64_t epoch) EXCLUDES(mu_);

  int rank() const { return rank_.load(std::memory_order_relaxed); }
  int size() const { return size_.load(std::memory_order_relaxed); }
  bool left() const { return left_.load(std::memory_order_relaxed); }
  WorldView view() const EXCLUDES(mu_);
  // The epoch and members (slots) of the world in force, as a kWorld announces them.
  std::pair<int64_t, std::vector<int32_t>> Current() const EXCLUDES(mu_);
  // The world in force as the scheduler describes it (for a restarted scheduler).
  v1::WorldInfo Info() const EXCLUDES(mu_);
  // Why an operation is refused once the worker left (empty: it did not).
  std::string LeftMessage() const EXCLUDES(mu_);

 private:
  // Starts following resize `epoch` when it is newer than the world and none is followed.
  void FollowLocked(int64_t epoch) REQUIRES(mu_);
  // One report of `step` for the resize followed (`wait`: until decided or `wait_`), made without
  // the lock; a decision it brings is kept.
  Status Report(int64_t epoch, int64_t step, bool wait) EXCLUDES(mu_);
  // Takes the decided world (it starts after the current boundary).
  Status Switch(const v1::ReachStepResponse& decided) EXCLUDES(mu_);
  void Adopt(const v1::WorldInfo& world) REQUIRES(mu_);

  const int32_t slot_;
  const int32_t slots_;  // the job's worker ranks (WorldView::slots)
  const int64_t incarnation_;
  const Hooks hooks_;
  const std::chrono::milliseconds wait_;

  mutable Mutex mu_;
  v1::WorldInfo world_ GUARDED_BY(mu_);  // the world in force
  // The resize under way as this worker knows it: the epoch, the step it first reported at, and
  // the decision once known.
  int64_t pending_epoch_ GUARDED_BY(mu_) = 0;
  int64_t reported_at_ GUARDED_BY(mu_) = -1;  // the step of its first report (-1: none yet)
  int64_t last_boundary_ GUARDED_BY(mu_) = -1;  // the last boundary passed (-1: none yet)
  // The scheduler's answer with the decided world (and, for a server resize, its map).
  std::optional<v1::ReachStepResponse> decided_ GUARDED_BY(mu_);
  std::string left_message_ GUARDED_BY(mu_);
  int64_t joined_from_ GUARDED_BY(mu_) = 0;
  std::atomic<int> rank_{0};
  std::atomic<int> size_{1};
  std::atomic<bool> left_{false};
};

}  // namespace trellis
