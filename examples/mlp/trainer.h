// The data-parallel training loop: SGD with momentum on this worker's shard, gradients summed
// over all workers per layer as soon as the backward pass produces them, each layer's update
// applied right before that layer's next forward (communication overlaps computation; there is
// no whole-model barrier per step).
#pragma once

#include <cstdint>
#include <ostream>
#include <vector>

#include "common/base/status.h"
#include "examples/mlp/exchange.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/options.h"

namespace trellis::mlp {

struct EpochStats {
  int epoch = 0;            // 1-based
  double train_loss = 0;    // mean over this worker's steps
  double test_loss = 0;     // rank 0 only
  double test_accuracy = 0; // rank 0 only
  double train_seconds = 0;
  double samples_per_second = 0;  // all workers
};

struct TrainReport {
  int64_t num_params = 0;
  int world = 1;
  int64_t steps = 0;              // per worker, in this run
  int64_t resumed_after = 0;      // global step restored from a checkpoint (0: none)
  bool stopped = false;           // ended early at options.stop_at_step
  // Restored at or after its last step (a finished job started again): nothing was trained, the
  // restored model was evaluated and judged as the job's result.
  bool already_finished = false;
  double test_accuracy = 0;       // rank 0 only
  double test_loss = 0;           // rank 0 only
  bool reached_target = false;    // rank 0 only
  double samples_per_second = 0;  // all workers
  double bytes_pushed = 0;        // all workers
  double bytes_pulled = 0;        // all workers
  // Workers whose program was restarted (rejoined): the bytes above include what their killed
  // processes moved (kept by their agents), except for `short_workers`, whose earlier processes
  // ran under another agent (a replaced pod) and whose bytes are lost with it.
  int restarted_workers = 0;
  int short_workers = 0;
  double compressed_in = 0;       // all workers: gradient bytes that were compressed
  double compressed_out = 0;      // all workers: what they were sent as
  double wall_seconds = 0;
  double train_seconds = 0;
  std::vector<EpochStats> epochs;
  // Elastic jobs (docs/elastic.md): resizes this worker went through, and whether it was resized
  // away (then after which global step; no statistics or result of its own).
  int resizes = 0;
  bool left = false;
  int64_t left_after = 0;
};

struct TrainOutput {
  std::ostream* out = nullptr;  // progress and results (rank 0); null: silent
  bool tty = false;             // carriage-return progress bar instead of one line per epoch
};

// Trains `model` (its shape must match options.sizes). Rank 0 evaluates on the test set after
// every epoch and prints the RESULT block at the end.
StatusOr<TrainReport> Train(const TrainOptions& options, Exchange& exchange, Mlp& model,
                            const TrainOutput& output);

// The RESULT lines (rank 0 prints them; exposed for tests and the guide).
std::string FormatResult(const TrainOptions& options, const TrainReport& report);

}  // namespace trellis::mlp
