// Training progress of one job, aggregated from the workers' ReportProgress calls
// (docs/kubernetes.md#progress): step, total, samples/s, loss, ETA, the slowest rank and the
// straggler. Kept apart from SchedulerState: it has its own lock and never blocks a control call.
//
// A straggler is judged on each rank's *busy* time per step (the time outside Trellis waits):
// in synchronous training every rank's wall-clock step is the slowest rank's, so only the busy
// time tells who holds the others back. A rank is above when its busy time exceeds `factor` x the
// median of the other live ranks (and by at least `min_excess`, so the jitter of microsecond
// steps is not a straggler); above without a break for `window`, it is the straggler (the one
// with the highest busy time when several are).
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "scheduler/clock.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

struct ProgressOptions {
  double straggler_factor = 2.0;                    // spec.monitoring.straggler.factor
  std::chrono::milliseconds straggler_window{30000};  // spec.monitoring.straggler.windowSeconds
  std::chrono::milliseconds min_excess{5};           // busy - median must be at least this
  std::chrono::milliseconds stale_after{15000};      // a rank silent this long is not live
  // Straggler states are re-judged at most this often (a report from each of 10^4 ranks a
  // second must not sort 10^4 figures each time).
  std::chrono::milliseconds judge_interval{250};
};

class ProgressTracker {
 public:
  // REQUIRES: num_workers >= 1; `clock` outlives the tracker.
  ProgressTracker(ProgressOptions options, int32_t num_workers, const Clock* clock);

  // INVALID_ARGUMENT for a rank outside [0, num_workers), steps < 1, negative or non-finite
  // figures. A report of an older incarnation than the rank's last is ignored.
  Status Report(const v1::ReportProgressRequest& req) EXCLUDES(mu_);
  // Rank 0 wrote a checkpoint (ReportCheckpoint) at `unix_ms`: the newest by step is the job's
  // (Snapshot's `checkpoint`); a `restored` one is also where the job resumed (`resumed_from`);
  // `exit_ready` alone (step 0, no path) says rank 0 runs a Checkpointer. INVALID_ARGUMENT for
  // a step < 1 or a path that is empty or over kMaxCheckpointPath bytes otherwise (nothing a
  // peer sends grows the state).
  static constexpr size_t kMaxCheckpointPath = 4096;
  Status NoteCheckpoint(const v1::ReportCheckpointRequest& req, int64_t unix_ms) EXCLUDES(mu_);
  // What rank 0 said of exit checkpoints: it writes them (ready); it wrote one (written).
  struct ExitState {
    bool ready = false;
    bool written = false;
  };
  ExitState exit_state() const EXCLUDES(mu_);
  // The job's progress now; `view` (the scheduler's cluster view) gives pod names and which
  // workers exited or are dead (those are not live).
  v1::JobProgress Snapshot(const v1::ClusterView& view) const EXCLUDES(mu_);

  const ProgressOptions& options() const { return options_; }

 private:
  using TimePoint = Clock::TimePoint;
  struct Rank {
    bool reported = false;
    int64_t incarnation = 0;
    int64_t step = 0;
    double step_seconds = 0;
    double busy_seconds = 0;
    double samples_per_second = 0;
    TimePoint last_report{};
    bool above = false;
    TimePoint above_since{};
  };
  // For each live rank (by `live`), whether its busy time is above the others' median;
  // `median_of_others[i]` gets that median.
  std::vector<bool> Above(const std::vector<bool>& live,
                          std::vector<double>* median_of_others) const REQUIRES(mu_);
  bool RecentLocked(const Rank& r, TimePoint now) const REQUIRES(mu_);
  void JudgeLocked(TimePoint now) REQUIRES(mu_);

  const ProgressOptions options_;
  const Clock* const clock_;
  const size_t num_ranks_;  // ranks_.size(), read without the lock
  mutable Mutex mu_;
  std::vector<Rank> ranks_ GUARDED_BY(mu_);  // index = worker rank
  int64_t total_steps_ GUARDED_BY(mu_) = 0;
  bool has_loss_ GUARDED_BY(mu_) = false;
  double loss_ GUARDED_BY(mu_) = 0;
  TimePoint last_judged_ GUARDED_BY(mu_){};
  v1::CheckpointInfo checkpoint_ GUARDED_BY(mu_);  // step 0: none reported
  v1::CheckpointInfo resumed_from_ GUARDED_BY(mu_);  // step 0: started afresh
  bool exit_ready_ GUARDED_BY(mu_) = false;
};

}  // namespace trellis
