// Worker::ReportProgress behind the API: records each step in memory and sends one batched
// ReportProgressRequest per interval from its own thread (started by the first report), so a
// program may call it every step at the cost of a lock and two clock reads. Busy time is wall
// time minus the time the program spent blocked in Trellis waits (`wait_ns`, kept by
// Handle::Wait and Barrier), which is what shows a straggler in synchronous training.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class ProgressReporter {
 public:
  using Send = std::function<Status(const v1::ReportProgressRequest&)>;
  using Clock = std::chrono::steady_clock;

  // `send` null: reports are recorded and dropped (a worker built without a scheduler).
  // `wait_ns` outlives the reporter.
  ProgressReporter(int32_t rank, int64_t incarnation, Send send,
                   const std::atomic<int64_t>* wait_ns,
                   std::chrono::milliseconds interval = std::chrono::milliseconds(1000));
  ~ProgressReporter();  // sends what is left (unless the last send failed), joins the thread
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  Status Report(int64_t step, int64_t samples, double loss) EXCLUDES(mu_);
  Status SetTotalSteps(int64_t total_steps) EXCLUDES(mu_);
  int64_t reports_sent() const { return sent_.load(); }

 private:
  void Loop() EXCLUDES(mu_);
  // Moves the batch into `out`; false when it holds no step.
  bool TakeLocked(v1::ReportProgressRequest* out) REQUIRES(mu_);

  const int32_t rank_;
  const int64_t incarnation_;
  const Send send_;
  const std::atomic<int64_t>* const wait_ns_;
  const std::chrono::milliseconds interval_;
  std::atomic<int64_t> sent_{0};

  Mutex mu_;
  CondVar cv_;
  bool started_ GUARDED_BY(mu_) = false;  // the thread runs
  bool stopping_ GUARDED_BY(mu_) = false;
  bool last_failed_ GUARDED_BY(mu_) = false;
  bool marked_ GUARDED_BY(mu_) = false;  // mark_ holds the last report's time
  Clock::time_point mark_ GUARDED_BY(mu_);
  int64_t mark_wait_ns_ GUARDED_BY(mu_) = 0;
  v1::ReportProgressRequest batch_ GUARDED_BY(mu_);  // the steps since the last send
  int64_t total_steps_ GUARDED_BY(mu_) = 0;
  std::thread thread_;  // started by the first report (under mu_), joined by the destructor
};

}  // namespace trellis
