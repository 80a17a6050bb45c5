// Crash recovery of a worker (docs/checkpoints.md#crash-recovery-workers), the checkpointer's half.
//
// On a live worker: Commit keeps a host copy of the tracked tensors at a step boundary; after the
// first commit a named thread ("trellis-rejoin") watches the scheduler for rejoin requests
// handed to this worker and serves them: it stashes the last commit on the servers under the
// rejoin id (holding the commit lock, so the copy cannot change under the transfer) and reports
// the step and its per-key push counts (RejoinServed).
//
// On a restarted worker (incarnation > 1): Rejoin asks the scheduler, fetches the donor's commit
// into the tracked tensors, takes over the donor's push counts and tells every server (kRejoin)
// that this worker's pushes of steps already counted are no-ops.
#pragma once

#include <cstdint>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/metrics/metrics.h"
#include "trellis/checkpoint.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {

class RejoinKeeper {
 public:
  // `params` on their keys; `state` is the checkpointer's packed state key buffer
  // ([step][state tensors]) of `state_elements` floats, on `state_key`. The buffers belong to
  // the caller and outlive the keeper. REQUIRES: impl's rejoin hooks are set.
  RejoinKeeper(WorkerImpl& impl, const std::vector<TensorRef>& params, KeyId state_key,
               float* state, int64_t state_elements);
  ~RejoinKeeper() EXCLUDES(stop_mu_);  // stops being a donor and joins the watcher
  RejoinKeeper(const RejoinKeeper&) = delete;
  RejoinKeeper& operator=(const RejoinKeeper&) = delete;

  // Copies the tensors (and `state`, packed by the caller) as the commit of `step`. The first
  // commit registers this worker as a donor with the scheduler (synchronously, so a rejoin asked
  // for after Restore returned finds it) and starts the watcher. The same step again is a no-op
  // unless `again` (the program changed its state at the same boundary: trellis.torch's
  // end-of-epoch bookkeeping after the last step's commit).
  Status Commit(int64_t step, bool again = false) EXCLUDES(commit_mu_);
  // A restarted worker: the donor's commit into the tensors and `state`. nullopt: no live worker
  // has committed a step (the job had not started training): start as on a first start.
  StatusOr<std::optional<int64_t>> Rejoin();
  // Every server treats this worker's pushes of steps already counted as no-ops (kRejoin).
  Status MarkServersRejoined();

 private:
  void WatchLoop() EXCLUDES(stop_mu_);
  // Stashes the last commit under `id` and reports it; errors go to the scheduler.
  void Serve(uint64_t id, int32_t rejoiner) EXCLUDES(commit_mu_);

  WorkerImpl& impl_;
  const std::vector<TensorRef> params_;
  const KeyId state_key_;
  float* const state_;
  const int64_t state_elements_;
  struct Series {
    prometheus::Counter* rejoins;  // this worker rejoined (restarted worker)
    prometheus::Counter* served;   // rejoins this worker served as donor
  } series_{};

  Mutex commit_mu_;  // held while copying a commit in, and while stashing it
  bool committed_ GUARDED_BY(commit_mu_) = false;
  int64_t step_ GUARDED_BY(commit_mu_) = -1;
  std::vector<std::vector<float>> params_copy_ GUARDED_BY(commit_mu_);
  std::vector<float> state_copy_ GUARDED_BY(commit_mu_);
  std::vector<std::pair<KeyId, int64_t>> key_steps_ GUARDED_BY(commit_mu_);

  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stopping_ GUARDED_BY(stop_mu_) = false;
  std::thread watcher_;  // started by the first Commit
};

}  // namespace trellis
