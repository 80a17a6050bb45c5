// The server half of checkpoints (docs/checkpoints.md), in update mode: the slices held here
// written with their weights, optimizer state and step count (a SAVE from rank 0), and a file
// installed as the slices' step-0 values (a LOAD, or a restarted server's newest file), so
// workers of a restarted job pull the restored weights exactly as they would receive a
// broadcast. In aggregate mode there is nothing to keep: sums do not outlive their step.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"
#include "common/checkpoint/checkpoint_dir.h"
#include "datapath/frame.h"
#include "pserver/pserver_metrics.h"
#include "pserver/slice_table.h"
#include "pserver/store_config.h"

namespace trellis {

class SliceCheckpoints {
 public:
  SliceCheckpoints(const StoreConfig& config, SliceTable* table, PserverMetrics* series)
      : config_(config), table_(table), series_(series) {}

  // Every initialized slice held here (weights, optimizer state, optimizer step count), except
  // those of `skip_key`; in aggregate mode nothing.
  Checkpoint Snapshot(int64_t step, uint64_t skip_key) const EXCLUDES(table_->mu());
  // Installs a snapshot as the slices' step-0 values (pulled like a broadcast) with their
  // optimizer state; everything is checked first, so a file that does not fit this shard map
  // changes nothing. Entries of keys absent from the map (declared late in the saving run) are
  // left out. Errors name `file`.
  Status RestoreFrom(const Checkpoint& c, const std::string& file) EXCLUDES(table_->mu());
  // The newest file of this server's directory, restored; *file and *step say which.
  Status RestoreNewest(std::string* file, int64_t* step) EXCLUDES(table_->mu());

  // SAVE: Snapshot to the checkpoint directory; LOAD: RestoreFrom the file of h.step.
  Status HandleOp(const wire::RequestHeader& h) EXCLUDES(table_->mu());

 private:
  CheckpointDir Dir() const;

  const StoreConfig& config_;
  SliceTable* const table_;
  PserverMetrics* const series_;
};

}  // namespace trellis
