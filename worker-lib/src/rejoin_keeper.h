// Crash recovery of a worker (docs/checkpoints.md#crash-recovery-workers), the checkpointer's half.
//
// On a live worker: Commit marks a step boundary; after the first commit a named thread
// ("trellis-rejoin") watches the scheduler for rejoin requests handed to this worker and serves
// them: it stashes the last commit on the servers under the rejoin id and reports the step and
// its per-key push counts (RejoinServed). What a commit keeps depends on the mode:
// - copy (the C++ Checkpointer, whose program updates its tensors where the library cannot see):
//   Commit copies the tracked tensors; Serve stashes the copy, holding the commit lock.
// - live (trellis.torch, whose optimizer step the library brackets): nothing is copied. The
//   caller promises the tensors change only between BeginUpdate and the next Commit; Serve waits
//   outside that window, BeginUpdate waits while a serve runs, and Serve stashes the tensors as
//   they are after `prepare(step)` filled the state buffer. A rejoin is rare and a commit is every
//   step: copying the model (and the optimizer state) at each step cost 7-22% of a step's time
//   in docs/performance.md's bench_models.
//
// On a restarted worker (incarnation > 1): Rejoin asks the scheduler, fetches the donor's commit
// into the tracked tensors, takes over the donor's push counts and tells every server (kRejoin)
// that this worker's pushes of steps already counted are no-ops.
#pragma once

#include <cstdint>
#include <functional>
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
  // Live mode's fill of the state buffer with the commit of `step`, called on the watcher thread
  // just before a stash (the tensors are as that commit left them).
  using Prepare = std::function<Status(int64_t step)>;

  // `params` on their keys; `state` is the checkpointer's packed state key buffer
  // ([step][state tensors]) of `state_elements` floats, on `state_key`. The buffers belong to
  // the caller and outlive the keeper. A `prepare` makes the keeper live (above), none copies.
  // REQUIRES: impl's rejoin hooks are set.
  RejoinKeeper(WorkerImpl& impl, const std::vector<TensorRef>& params, KeyId state_key,
               float* state, int64_t state_elements, Prepare prepare = nullptr);
  ~RejoinKeeper() EXCLUDES(stop_mu_);  // stops being a donor and joins the watcher
  RejoinKeeper(const RejoinKeeper&) = delete;
  RejoinKeeper& operator=(const RejoinKeeper&) = delete;

  // The commit of `step`: copy mode copies the tensors (and `state`, packed by the caller); live
  // mode ends the window BeginUpdate opened, and copies only when `copy` (the caller is about to
  // change the tensors where it cannot open a window: a serve stashes the copy until the next
  // commit). The first commit registers this worker as a donor with the scheduler
  // (synchronously, so a rejoin asked for after Restore returned finds it) and starts the
  // watcher. The same step again is a no-op unless `again` (the program changed its state at the
  // same boundary: trellis.torch's end-of-epoch bookkeeping after the last step's commit); it
  // keeps that step's push counts.
  Status Commit(int64_t step, bool again = false, bool copy = false) EXCLUDES(commit_mu_);
  // Live mode: the caller is about to change the tracked tensors or what `prepare` reads (waits
  // while a serve runs); the next Commit ends the window. Copy mode: nothing.
  void BeginUpdate() EXCLUDES(commit_mu_);
  // A restarted worker: the donor's commit into the tensors and `state`. nullopt: no live worker
  // has committed a step (the job had not started training): start as on a first start.
  // A worker joining a grow (WorkerImpl::JoinedFrom() F > 0) takes the commit of F-1 (the donor
  // is asked again until it committed that step: it cannot go past it without the joiner, at
  // most the operation timeout), none is FAILED_PRECONDITION, and then it tells the servers the
  // world it joined (docs/elastic.md#growing).
  StatusOr<std::optional<int64_t>> Rejoin();
  // Every server treats this worker's pushes of steps already counted as no-ops (kRejoin).
  Status MarkServersRejoined();

 private:
  // Rejoin's fetch: a commit of `at_least` or later (<= 0: any), or nullopt when none.
  StatusOr<std::optional<int64_t>> TakeCommit(int64_t at_least);
  void WatchLoop() EXCLUDES(stop_mu_);
  // Stashes the last commit under `id` and reports it; errors go to the scheduler.
  void Serve(uint64_t id, int32_t rejoiner) EXCLUDES(commit_mu_);
  // Stashes the last commit and fills `done`'s step and push counts: its copy when it was
  // copied (every commit in copy mode), else the live tensors after prepare.
  Status StashLastCommit(uint64_t id, v1::RejoinServedRequest& done) EXCLUDES(commit_mu_);
  // Stashes `bufs` (one per tracked tensor, then the state) under `id`.
  Status Stash(uint64_t id, const std::vector<float*>& bufs);

  WorkerImpl& impl_;
  const std::vector<TensorRef> params_;
  const KeyId state_key_;
  float* const state_;
  const int64_t state_elements_;
  const Prepare prepare_;  // null: copy mode
  struct Series {
    prometheus::Counter* rejoins;  // this worker rejoined (restarted worker)
    prometheus::Counter* served;   // rejoins this worker served as donor
  } series_{};

  // Copy mode: held while copying a commit in, and while stashing it. Live mode: guards the
  // update window and the serve that excludes it.
  Mutex commit_mu_;
  CondVar window_cv_;  // live mode: updating_ or serving_ went false, or closing_ true
  bool committed_ GUARDED_BY(commit_mu_) = false;
  int64_t step_ GUARDED_BY(commit_mu_) = -1;
  std::vector<std::vector<float>> params_copy_ GUARDED_BY(commit_mu_);  // copy mode
  std::vector<float> state_copy_ GUARDED_BY(commit_mu_);                // copy mode
  bool copied_ GUARDED_BY(commit_mu_) = false;  // the last commit is in the copies (always in copy mode)
  std::vector<std::pair<KeyId, int64_t>> key_steps_ GUARDED_BY(commit_mu_);
  bool updating_ GUARDED_BY(commit_mu_) = false;  // live: between BeginUpdate and Commit
  bool serving_ GUARDED_BY(commit_mu_) = false;   // live: a serve reads the tensors
  bool closing_ GUARDED_BY(commit_mu_) = false;   // the destructor: a waiting serve gives up

  Mutex stop_mu_;
  CondVar stop_cv_;
  bool stopping_ GUARDED_BY(stop_mu_) = false;
  std::thread watcher_;  // started by the first Commit
};

}  // namespace trellis
