// A server resize on the server (docs/elastic.md#servers): the slices a new shard map moves,
// handed from their old owner to their new one between two steps.
//
// The resize takes effect at a step boundary every worker agrees on, as a workers' resize does
// (scheduler/world_plan.h): after every worker pulled step F-1 and before any pushes F. There
// each worker installs the resize's shard map on every server (SliceTable::Install: a map of a
// newer world epoch retires the slices it moves away and makes those it moves in, waiting), then
// for every moved slice takes each part of its state from the old owner (kHandOut of step F-1)
// and gives it to the new one (kHandIn), and only then pushes F to the new owners. The state
// (datapath/handover.h) is what the next step needs: the step the slice completed, the kept
// result of it (the sum in aggregate mode, the weights in update mode), and in update mode the
// optimizer's moments and step base, so the steps after the move are computed exactly as they
// would have been without it.
//
// Any number of workers may move a slice: the first hand-in of a part fills it, a repeat of the
// same step is answered OK and changes nothing, so no worker waits for another, and one that
// restarts mid-move can ask again. The old owner keeps a moved slice's state until every member
// of its world (but those lost for good) took every part, then frees it. The new owner answers nothing but hand-ins on a
// slice until every part arrived.
//
// Every call takes the table's lock as a reader and the slice's lock.
#pragma once

#include <cstdint>

#include "common/base/status.h"
#include "datapath/frame.h"
#include "datapath/handover.h"
#include "pserver/pserver_metrics.h"
#include "pserver/slice.h"
#include "pserver/slice_table.h"
#include "pserver/store_config.h"

namespace trellis {

class SliceHandover {
 public:
  SliceHandover(const StoreConfig& config, SliceTable* table, PserverMetrics* series)
      : config_(config), table_(table), series_(series) {}

  // kHandOut from `worker`: the part its payload names of the moved slice (key, slice), which
  // must have completed step h.step and nothing after it. Answered with the part's words.
  void HandOut(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
               StoreReply reply) EXCLUDES(table_->mu());
  // kHandIn: fills a part of the slice (key, slice) held here, which the resize moved here (or a
  // fresh slice of a server the resize started).
  Status HandIn(const wire::RequestHeader& h, const wire::Chunks& frame) EXCLUDES(table_->mu());

  // Worker `slot` was lost for good (SliceStore::LoseWorker): a moved-away slice no longer waits
  // for it to take its state, and is freed if the others took it all.
  void WorkerLost(int32_t slot) EXCLUDES(table_->mu());

  // A data request on `s` while its state is still moving in: FAILED_PRECONDITION naming it.
  static Status RefuseWhileMovingIn(const Slice& s) REQUIRES(s.mu);

 private:
  StatusOr<Values> TakePart(int32_t worker, Slice* s, wire::HandoverPart part, int64_t step)
      REQUIRES(s->mu);
  // Frees a moved-away slice's state once every member of its world still in the job took every
  // part it has.
  void ReleaseIfTaken(Slice* s) REQUIRES(s->mu);
  Status FillState(Slice* s, const wire::Chunks& frame, uint64_t bytes) REQUIRES(s->mu);
  Status FillMoment(Slice* s, wire::HandoverPart part, const wire::Chunks& frame, uint64_t bytes)
      REQUIRES(s->mu);

  const StoreConfig& config_;
  SliceTable* const table_;
  PserverMetrics* const series_;
};

}  // namespace trellis
