#include "scheduler/progress_tracker.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace trellis {
namespace {

bool Finite(double v) { return std::isfinite(v); }

// The lower median of `v` (sorted in place); 0 when empty.
double LowerMedian(std::vector<double>* v) {
  if (v->empty()) return 0;
  std::sort(v->begin(), v->end());
  return (*v)[(v->size() - 1) / 2];
}

}  // namespace

ProgressTracker::ProgressTracker(ProgressOptions options, int32_t num_workers, const Clock* clock)
    : options_(options),
      clock_(clock),
      num_ranks_(static_cast<size_t>(std::max(num_workers, 1))),
      ranks_(num_ranks_) {}

Status ProgressTracker::Report(const v1::ReportProgressRequest& req) {
  if (req.rank() < 0 || req.rank() >= static_cast<int32_t>(num_ranks_)) {
    return InvalidArgumentError("ReportProgress: rank " + std::to_string(req.rank()) +
                                " outside [0, " + std::to_string(num_ranks_) + ")");
  }
  if (req.steps() < 1 || req.step() < 0 || req.total_steps() < 0 || req.samples() < 0 ||
      !Finite(req.seconds()) || req.seconds() < 0 || !Finite(req.busy_seconds()) ||
      req.busy_seconds() < 0 || (req.has_loss() && !Finite(req.loss()))) {
    return InvalidArgumentError(
        "ReportProgress: steps must be >= 1; step, total_steps, samples, seconds and "
        "busy_seconds >= 0 and finite; loss finite");
  }
  const TimePoint now = clock_->Now();
  MutexLock lock(&mu_);
  Rank& r = ranks_[static_cast<size_t>(req.rank())];
  if (r.reported && req.incarnation() < r.incarnation) return Status::Ok();  // an old process
  if (req.incarnation() != r.incarnation) r.above = false;  // a new process: judged afresh
  r.reported = true;
  r.incarnation = req.incarnation();
  r.step = req.step();
  const double steps = static_cast<double>(req.steps());
  r.step_seconds = req.seconds() / steps;
  r.busy_seconds = std::min(req.busy_seconds(), req.seconds()) / steps;
  r.samples_per_second =
      req.seconds() > 0 ? static_cast<double>(req.samples()) / req.seconds() : 0;
  r.last_report = now;
  if (req.total_steps() > 0) total_steps_ = req.total_steps();
  if (req.has_loss()) {
    has_loss_ = true;
    loss_ = req.loss();
  }
  if (now - last_judged_ >= options_.judge_interval) JudgeLocked(now);
  return Status::Ok();
}

bool ProgressTracker::RecentLocked(const Rank& r, TimePoint now) const {
  return r.reported && now - r.last_report <= options_.stale_after;
}

std::vector<bool> ProgressTracker::Above(const std::vector<bool>& live,
                                         std::vector<double>* median_of_others) const {
  std::vector<double> busy;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (live[i]) busy.push_back(ranks_[i].busy_seconds);
  }
  std::sort(busy.begin(), busy.end());
  std::vector<bool> above(ranks_.size(), false);
  median_of_others->assign(ranks_.size(), 0);
  if (busy.size() < 2) return above;  // nobody to compare with
  // Without rank i the others are n-1 values; their lower median is busy[k] or busy[k+1],
  // depending on whether i's value sits above or at/below index k.
  const size_t k = (busy.size() - 2) / 2;
  const double min_excess = std::chrono::duration<double>(options_.min_excess).count();
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (!live[i]) continue;
    const double b = ranks_[i].busy_seconds;
    const double med = b > busy[k] ? busy[k] : busy[k + 1];
    (*median_of_others)[i] = med;
    above[i] = b > options_.straggler_factor * med && b - med >= min_excess;
  }
  return above;
}

void ProgressTracker::JudgeLocked(TimePoint now) {
  last_judged_ = now;
  std::vector<bool> live(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) live[i] = RecentLocked(ranks_[i], now);
  std::vector<double> medians;
  const std::vector<bool> above = Above(live, &medians);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (above[i] && !r.above) r.above_since = now;
    r.above = above[i];
  }
}

Status ProgressTracker::NoteCheckpoint(const v1::ReportCheckpointRequest& req, int64_t unix_ms) {
  if (req.exit_ready() && req.step() == 0 && req.path().empty() && !req.on_exit() && !req.restored()) {
    MutexLock lock(&mu_);
    exit_ready_ = true;
    return Status::Ok();
  }
  if (req.step() < 1 || req.path().empty() || req.path().size() > kMaxCheckpointPath) {
    return InvalidArgumentError("ReportCheckpoint: step must be >= 1 and path 1 to " +
                                std::to_string(kMaxCheckpointPath) + " bytes");
  }
  if (req.restored() && req.on_exit()) {
    return InvalidArgumentError("ReportCheckpoint: a checkpoint is either restored or written on exit");
  }
  MutexLock lock(&mu_);
  exit_ready_ |= req.exit_ready();
  if (req.restored()) {
    resumed_from_.set_step(req.step());
    resumed_from_.set_path(req.path());
    resumed_from_.set_unix_ms(unix_ms);
  }
  if (req.step() < checkpoint_.step()) return Status::Ok();  // an older one, reported late
  checkpoint_.set_step(req.step());
  checkpoint_.set_path(req.path());
  checkpoint_.set_unix_ms(unix_ms);
  checkpoint_.set_on_exit(req.on_exit());
  return Status::Ok();
}

ProgressTracker::ExitState ProgressTracker::exit_state() const {
  MutexLock lock(&mu_);
  return {exit_ready_, checkpoint_.on_exit()};
}

v1::JobProgress ProgressTracker::Snapshot(const v1::ClusterView& view) const {
  const TimePoint now = clock_->Now();
  v1::JobProgress p;
  p.set_straggler_factor(options_.straggler_factor);
  p.set_straggler_window_seconds(Seconds(options_.straggler_window));
  p.set_slowest_rank(-1);
  p.set_straggler_rank(-1);
  p.set_eta_seconds(-1);
  MutexLock lock(&mu_);
  if (checkpoint_.step() > 0) *p.mutable_checkpoint() = checkpoint_;
  if (resumed_from_.step() > 0) *p.mutable_resumed_from() = resumed_from_;
  p.set_exit_ready(exit_ready_);
  std::vector<bool> live(ranks_.size());
  for (size_t i = 0; i < ranks_.size(); ++i) {
    live[i] = RecentLocked(ranks_[i], now);
    if (static_cast<int>(i) < view.workers_size()) {
      const auto& n = view.workers(static_cast<int>(i));
      if (n.exited() || n.dead()) live[i] = false;
    }
  }
  std::vector<double> medians;
  const std::vector<bool> above = Above(live, &medians);

  std::vector<double> steps, step_seconds;
  int64_t min_step = INT64_MAX;
  double samples_per_second = 0;
  int32_t slowest = -1;
  double straggler_busy = -1;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    auto* rp = p.add_ranks();
    rp->set_rank(static_cast<int32_t>(i));
    if (static_cast<int>(i) < view.workers_size()) {
      rp->set_pod_name(view.workers(static_cast<int>(i)).pod_name());
    }
    if (!r.reported) continue;
    rp->set_step(r.step);
    rp->set_step_seconds(r.step_seconds);
    rp->set_busy_seconds(r.busy_seconds);
    rp->set_samples_per_second(r.samples_per_second);
    rp->set_live(live[i]);
    steps.push_back(static_cast<double>(r.step));
    min_step = std::min(min_step, r.step);
    if (!live[i]) continue;
    samples_per_second += r.samples_per_second;
    step_seconds.push_back(r.step_seconds);
    if (slowest < 0 || r.busy_seconds > ranks_[static_cast<size_t>(slowest)].busy_seconds) {
      slowest = static_cast<int32_t>(i);
    }
    if (above[i] && r.above) {
      const double for_seconds = Seconds(now - r.above_since);
      rp->set_slow_for_seconds(for_seconds);
      if (now - r.above_since >= options_.straggler_window && r.busy_seconds > straggler_busy) {
        straggler_busy = r.busy_seconds;
        p.set_straggler_rank(static_cast<int32_t>(i));
        p.set_straggler_pod(rp->pod_name());
        p.set_straggler_for_seconds(for_seconds);
      }
    }
  }
  if (steps.empty()) return p;
  p.set_reported(true);
  p.set_step(min_step);
  p.set_median_step(static_cast<int64_t>(LowerMedian(&steps)));
  p.set_total_steps(total_steps_);
  p.set_samples_per_second(samples_per_second);
  if (has_loss_) {
    p.set_has_loss(true);
    p.set_loss(loss_);
  }
  const double step_time = LowerMedian(&step_seconds);
  p.set_step_seconds(step_time);
  if (total_steps_ > 0 && step_time > 0) {
    p.set_eta_seconds(static_cast<double>(std::max<int64_t>(total_steps_ - min_step, 0)) *
                      step_time);
  } else if (total_steps_ > 0 && min_step >= total_steps_) {
    p.set_eta_seconds(0);
  }
  if (slowest >= 0) {
    p.set_slowest_rank(slowest);
    p.set_slowest_pod(p.ranks(slowest).pod_name());
    const double med = medians[static_cast<size_t>(slowest)];
    const double busy = ranks_[static_cast<size_t>(slowest)].busy_seconds;
    p.set_skew(med > 0 ? busy / med : 0);  // 0: not known (one live rank, or all idle)
  }
  return p;
}

}  // namespace trellis
