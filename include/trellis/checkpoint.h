// Checkpoints of a training program, saved by rank 0 and restored on every worker through a
// broadcast from rank 0 (docs/checkpoints.md). Three lines in a training program:
//
//   auto ckpt = trellis::Checkpointer::Create(*worker, params, state);  // before FinishDeclarations
//   int64_t step = (*ckpt)->Restore().value();     // after it: every worker holds rank 0's values
//   ... after each step s (all updates applied): (*ckpt)->EndStep(s);
//
// EndStep also keeps the commit a restarted worker rejoins the running job from (crash
// recovery: a worker killed mid-training comes back under its rank and continues where the
// others are; docs/checkpoints.md#crash-recovery-workers).
//
// Restore doubles as the initial broadcast: with no checkpoint in the directory, rank 0's own
// values are sent to everyone and the step is 0. The directory, interval and count kept come from
// the job's spec.checkpoint unless CheckpointOptions overrides them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trellis/status.h"
#include "trellis/trellis.h"

namespace trellis {

// One tensor the checkpointer saves and restores in place. The buffer belongs to the caller and
// must outlive the checkpointer.
struct TensorRef {
  std::string name;  // unique among the tracked tensors; recorded in the file
  float* data = nullptr;
  int64_t num_elements = 0;
  KeyId key = 0;  // parameters only: the declared key they are broadcast on
};

// Overrides of the job's spec.checkpoint (empty / negative / zero: take the job's).
struct CheckpointOptions {
  std::string path;
  int64_t interval_steps = -1;
  int32_t keep = 0;
  // The extra key that carries the step and the `state` tensors; must not be a model key.
  // (Small enough for multi-GPU pods, whose part keys are id * G + l.)
  KeyId state_key = 0x00FFFFFFFFFF0000ull;
  // Crash recovery: every Commit copies the tracked tensors (params and state) into host memory,
  // so that a restarted worker can rejoin from a live one. Costs one host copy of all tracked
  // tensors and a memcpy of them per step. Off: a restarted worker cannot rejoin (its Restore
  // starts over as on a first start, which only works before training started).
  bool rejoin = true;
};

class Checkpointer {
 public:
  // `params`: the model parameters, each on its own declared key. `state`: any other state to
  // restore bit for bit (e.g. a worker-side optimizer's momentum), carried on one key the
  // checkpointer declares itself. REQUIRES: before worker.FinishDeclarations().
  static StatusOr<std::unique_ptr<Checkpointer>> Create(Worker& worker, std::vector<TensorRef> params,
                                                        std::vector<TensorRef> state = {},
                                                        const CheckpointOptions& options = {});
  virtual ~Checkpointer();

  // Collective, after FinishDeclarations and before the first push. Rank 0 loads the newest
  // checkpoint that passes its checks (newer ones that are corrupt, truncated or of another
  // version are skipped with a warning naming the file and the problem) and every worker ends
  // with rank 0's parameters and state. Returns the step to resume after (0: nothing restored).
  // A checkpoint that does not fit the tracked tensors is an error on rank 0, reported to the
  // other workers as a failed restore (never a hang).
  // On a worker its agent restarted (TRELLIS_INCARNATION > 1) while the job runs, Restore
  // rejoins instead: the tensors become a live worker's last commit and the returned step is
  // that commit's (not a collective then: the others keep training). Restore commits its step.
  virtual StatusOr<int64_t> Restore() = 0;

  // The tracked tensors hold the values after `step` and every handle of the step was waited
  // for (and no push of step+1 started): keeps them as the commit a restarted worker rejoins
  // from. Call once per step in step order; the same step again is a no-op. A loop that
  // overlaps the next step's first layers with the last updates can call it at the point where
  // the previous step's updates are all applied (examples/mlp does, after the forward pass).
  // A rejoiner takes over the push counts of every key, tracked or not; the values of keys the
  // checkpointer does not track (e.g. statistics summed now and then) are not carried.
  // Elastic jobs (docs/elastic.md): a resize takes effect here, so worker.world() (rank, size)
  // may differ afterwards; when world().left, this worker stops training and exits 0.
  virtual Status Commit(int64_t step) = 0;
  // Commit(step), then Save(step) when Due(step): the one per-step call of a simple loop.
  virtual Status EndStep(int64_t step) = 0;

  // Whether a checkpoint is due after `step` (>= 1): rank 0, a path, and step % interval == 0.
  virtual bool Due(int64_t step) const = 0;
  // Rank 0 writes the tracked tensors as the checkpoint of `step` (no-op on other ranks, and
  // without a path). Write to a temporary file, fsync, rename; the newest `keep` are kept.
  virtual Status Save(int64_t step) = 0;

  // The directory in use (empty: checkpoints off) and what rank 0 did last.
  virtual const std::string& path() const = 0;
  virtual const std::string& last_file() const = 0;  // saved or restored
  virtual uint64_t saves() const = 0;
  virtual uint64_t bytes_written() const = 0;
};

}  // namespace trellis
