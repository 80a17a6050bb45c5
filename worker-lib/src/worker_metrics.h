// The worker's series on the process's MetricsRegistry (docs/metrics.md), registered once when
// the worker is made; the data path calls the small methods below (no lookups per event).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "common/base/mutex.h"
#include "common/metrics/metrics.h"
#include "datapath/frame.h"

namespace trellis {

class WorkerMetrics {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkerMetrics(MetricsRegistry& registry);

  // A key's push number `step` (1, 2, ...) started. Steps are counted by the key pushed most:
  // step n starts with the first push numbered n.
  void KeyPushed(int64_t step) EXCLUDES(mu_);
  // One operation of `op` finished after `seconds` (ok or not).
  void OperationDone(wire::Op op, bool ok, double seconds);
  void SliceSent() { slices_sent_.Increment(); }
  void BytesPushed(uint64_t n) { pushed_bytes_.Increment(static_cast<double>(n)); }
  void BytesPulled(uint64_t n) { pulled_bytes_.Increment(static_cast<double>(n)); }
  void SampleQueue(size_t queued, int in_flight) {
    queue_depth_.Set(static_cast<double>(queued));
    in_flight_.Set(in_flight);
  }
  void BarrierWaited(double seconds) { barrier_wait_.Observe(seconds); }
  // Counted by the recovering connections (server_connection.h).
  prometheus::Counter* reconnects() { return &reconnects_; }
  prometheus::Counter* replayed() { return &replayed_; }

 private:
  prometheus::Counter& steps_;
  prometheus::Histogram& step_seconds_;
  prometheus::Counter& pushed_bytes_;
  prometheus::Counter& pulled_bytes_;
  prometheus::Counter& slices_sent_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& in_flight_;
  prometheus::Histogram& barrier_wait_;
  prometheus::Counter& reconnects_;
  prometheus::Counter& replayed_;
  // Indexed by wire::Op order below: push, pull, pushpull, broadcast.
  prometheus::Histogram* op_seconds_[4];
  prometheus::Counter* op_errors_[4];

  Mutex mu_;
  int64_t last_step_ GUARDED_BY(mu_) = 0;
  Clock::time_point last_step_time_ GUARDED_BY(mu_);  // when last_step_ started
};

}  // namespace trellis
