// Crash recovery of a parameter server (docs/checkpoints.md, "Crash recovery: servers"): a
// restarted server is fresh; every worker reconnects, re-installs the shard map and replays the
// last two pushes it made on each slice held here (wire::Op::kReplay), then ends its replays.
//
// Why two pushes are enough: on one slice the workers are at most one step apart (a worker
// pushes t+1 only after its pull of t, which needed every push of t), so the union of the
// workers' last two pushes holds every contribution of the newest complete step and of the one
// in progress. Per slice the rebuild keeps the contributions per step and worker (a worker's
// duplicate is ignored); once all W workers ended their replays, the highest step with all W
// contributions (W: the members of the slice's world, pserver/world_schedule.h; a restarted
// server starts from the job's first world: docs/elastic.md says what that means) becomes
// `complete` (its result made as any step's, pserver/step_update.h; in
// update mode on top of the newest checkpoint), the contributions of the step after it the
// accumulator, and older steps are dropped. A worker lost for good (an elastic job) is neither
// waited for nor counted (Lose). Pulls wait for that; pushes that come meanwhile are
// contributions too.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "datapath/frame.h"
#include "pserver/pserver_metrics.h"
#include "pserver/slice.h"
#include "pserver/slice_checkpoints.h"
#include "pserver/slice_table.h"
#include "pserver/step_protocol.h"
#include "pserver/step_update.h"
#include "pserver/store_config.h"

namespace trellis {

class SliceRebuild {
 public:
  SliceRebuild(const StoreConfig& config, const WorldSchedule* worlds, SliceTable* table,
               StepProtocol* protocol, const StepUpdate* update, SliceCheckpoints* checkpoints,
               PserverMetrics* series)
      : config_(config), worlds_(worlds), table_(table), protocol_(protocol), update_(update),
        checkpoints_(checkpoints), series_(series) {}

  // A kReplay from `worker`: one replayed push, or (no payload) the end of its replays with
  // their count in h.step. The first one decides whether this store rebuilds (it is fresh) or
  // replays are pushes that may have been lost on a live server. `reply` runs once, after the
  // locks are released.
  void HandleReplay(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
                    StoreReply reply) EXCLUDES(mu_);

  // Push, pull or pushpull on a slice that is being rebuilt (s->rebuild set): a push is one more
  // contribution, a pull waits for the rebuild. `reply` null: a replay (answered by the caller).
  void Request(int32_t worker, Slice* s, const wire::RequestHeader& h, const Gradient& grad,
               StoreReply reply, std::vector<DeferredReply>* out) REQUIRES(s->mu);

  // Whether a rebuild is under way (tests).
  bool Rebuilding() const EXCLUDES(mu_);

  // Worker `slot` is lost for good (SliceStore::LoseWorker): it will not replay. A rebuild does
  // not wait for it and leaves its contributions out (it cannot make up what it did not
  // replay); the rebuilt slices do not await it from their next step on. Ends a rebuild that
  // waited only for it.
  void Lose(int32_t slot) EXCLUDES(mu_);
  // A world names `slot` again (a grow brought it back): its replays count again.
  void Unlose(int32_t slot) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    lost_.erase(slot);
  }

 private:
  enum class Phase { kNotSeen, kRebuilding, kOver };

  // Answers what completed, after the locks are released.
  void RunDeferred(std::vector<DeferredReply>* deferred) EXCLUDES(mu_);
  void StartLocked() REQUIRES(mu_);
  // Every worker of the world but the lost ones ended its replays: FinishLocked.
  void FinishIfReplayedLocked(std::vector<DeferredReply>* out) REQUIRES(mu_);
  // All workers ended their replays: every slice takes its rebuilt state.
  void FinishLocked(std::vector<DeferredReply>* out) REQUIRES(mu_);
  void FinalizeSlice(Slice* s, std::vector<DeferredReply>* out) REQUIRES(mu_, s->mu);

  const StoreConfig& config_;
  const WorldSchedule* const worlds_;
  SliceTable* const table_;
  StepProtocol* const protocol_;
  const StepUpdate* const update_;
  SliceCheckpoints* const checkpoints_;
  PserverMetrics* const series_;

  // Lock order: mu_, then the table's lock, then a slice's.
  mutable Mutex mu_;
  Phase phase_ GUARDED_BY(mu_) = Phase::kNotSeen;
  Status error_ GUARDED_BY(mu_);                        // refuses all replays
  std::vector<int64_t> replays_seen_ GUARDED_BY(mu_);   // per worker
  std::vector<int64_t> replays_announced_ GUARDED_BY(mu_);  // per worker, -1: not yet
  std::set<int32_t> lost_ GUARDED_BY(mu_);                   // Lose: not awaited, not counted
};

}  // namespace trellis
