// The parameter server's series on the process's MetricsRegistry (docs/metrics.md), registered
// once when the store is made. Counted in the store, so the gRPC and raw-TCP paths agree.
#pragma once

#include <cstdint>

#include "common/metrics/metrics.h"
#include "datapath/frame.h"

namespace trellis {

class PserverMetrics {
 public:
  explicit PserverMetrics(MetricsRegistry& registry);

  void Request(wire::Op op, uint64_t payload_bytes);
  void RequestFailed() { request_errors_.Increment(); }
  void Sent(uint64_t bytes) { sent_bytes_.Increment(static_cast<double>(bytes)); }
  void Aggregated(double seconds) { aggregation_seconds_.Observe(seconds); }
  void StepCompleted(double update_seconds) {
    slice_steps_.Increment();
    update_seconds_.Observe(update_seconds);
  }
  void PullWaiting() { waiting_pulls_.Increment(); }
  void PullAnswered(size_t n = 1) { waiting_pulls_.Decrement(static_cast<double>(n)); }
  void CheckpointSaved(double seconds, uint64_t bytes) {
    checkpoint_saves_.Increment();
    checkpoint_save_seconds_.Observe(seconds);
    checkpoint_size_bytes_.Set(static_cast<double>(bytes));
  }
  void CheckpointRestored() { checkpoint_restores_.Increment(); }
  void SlicesRebuilt(int64_t n) { rebuilt_slices_.Increment(static_cast<double>(n)); }
  // A server resize (slice_handover.h): a slice's whole state arrived here; one moved away was
  // taken by every worker and freed here.
  void SliceMovedIn() { moved_in_slices_.Increment(); }
  void SliceMovedOut() { moved_out_slices_.Increment(); }
  void SlicesHeld(int64_t slices, int64_t bytes) {
    slices_.Set(static_cast<double>(slices));
    slice_bytes_.Set(static_cast<double>(bytes));
  }

 private:
  prometheus::Counter* requests_[4];  // push, pull, pushpull, init
  prometheus::Counter& received_bytes_;
  prometheus::Counter& sent_bytes_;
  prometheus::Counter& request_errors_;
  prometheus::Histogram& aggregation_seconds_;
  prometheus::Histogram& update_seconds_;
  prometheus::Counter& slice_steps_;
  prometheus::Gauge& waiting_pulls_;
  prometheus::Gauge& slices_;
  prometheus::Gauge& slice_bytes_;
  prometheus::Histogram& checkpoint_save_seconds_;
  prometheus::Gauge& checkpoint_size_bytes_;
  prometheus::Counter& checkpoint_saves_;
  prometheus::Counter& checkpoint_restores_;
  prometheus::Counter& rebuilt_slices_;
  prometheus::Counter& moved_in_slices_;
  prometheus::Counter& moved_out_slices_;
};

}  // namespace trellis
