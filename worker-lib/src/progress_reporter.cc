#include "worker-lib/src/progress_reporter.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/base/logging.h"

namespace trellis {

ProgressReporter::ProgressReporter(int32_t rank, int64_t incarnation, Send send,
                                   const std::atomic<int64_t>* wait_ns,
                                   std::chrono::milliseconds interval)
    : rank_(rank),
      incarnation_(incarnation),
      send_(std::move(send)),
      wait_ns_(wait_ns),
      interval_(interval) {}

ProgressReporter::~ProgressReporter() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

Status ProgressReporter::Report(int64_t step, int64_t samples, double loss) {
  if (step < 0 || samples < 0) {
    return InvalidArgumentError("ReportProgress: step and samples must be >= 0, got step " +
                                std::to_string(step) + ", samples " + std::to_string(samples));
  }
  const auto now = Clock::now();
  const int64_t waited = wait_ns_ != nullptr ? wait_ns_->load(std::memory_order_relaxed) : 0;
  MutexLock lock(&mu_);
  batch_.set_step(step);
  if (std::isfinite(loss)) {
    batch_.set_has_loss(true);
    batch_.set_loss(loss);
  }
  if (marked_) {  // the first report only starts the clock: no step time to give yet
    const double wall = std::chrono::duration<double>(now - mark_).count();
    const double busy = std::max(0.0, wall - static_cast<double>(waited - mark_wait_ns_) * 1e-9);
    batch_.set_steps(batch_.steps() + 1);
    batch_.set_seconds(batch_.seconds() + wall);
    batch_.set_busy_seconds(batch_.busy_seconds() + busy);
    batch_.set_samples(batch_.samples() + samples);
  }
  marked_ = true;
  mark_ = now;
  mark_wait_ns_ = waited;
  if (!started_ && send_) {
    started_ = true;
    thread_ = std::thread([this] { Loop(); });
  }
  return Status::Ok();
}

Status ProgressReporter::SetTotalSteps(int64_t total_steps) {
  if (total_steps < 0) {
    return InvalidArgumentError("SetTotalSteps: must be >= 0, got " + std::to_string(total_steps));
  }
  MutexLock lock(&mu_);
  total_steps_ = total_steps;
  return Status::Ok();
}

bool ProgressReporter::TakeLocked(v1::ReportProgressRequest* out) {
  if (batch_.steps() < 1) return false;
  *out = batch_;
  out->set_rank(rank_);
  out->set_incarnation(incarnation_);
  out->set_total_steps(total_steps_);
  const int64_t step = batch_.step();
  batch_.Clear();
  batch_.set_step(step);
  return true;
}

void ProgressReporter::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    // Until the interval passed or the reporter stops.
    const auto until = Clock::now() + interval_;
    while (!stopping_ && cv_.WaitUntil(&mu_, until)) {
    }
    const bool last = stopping_;
    if (last && last_failed_) return;  // the scheduler is gone: do not hold up the exit
    v1::ReportProgressRequest req;
    if (TakeLocked(&req)) {
      lock.Unlock();
      Status st = send_(req);
      if (st.ok()) sent_.fetch_add(1);
      lock.Lock();
      // One line when reporting starts failing, not one a second.
      if (!st.ok() && !last_failed_) TLOG_WARN << "progress report not sent: " << st.ToString();
      last_failed_ = !st.ok();
    }
    if (last) return;
  }
}

}  // namespace trellis
