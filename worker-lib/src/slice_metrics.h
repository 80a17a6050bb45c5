// The worker's P3 scheduling metrics (docs/metrics.md), registered once per worker:
//   trellis_worker_queue_depth_by_band_slices{band}  slices waiting, per priority band
//   trellis_worker_slice_wait_seconds                queued -> bytes handed to the kernel
//   trellis_worker_slice_round_trip_seconds          handed to the transport -> answered
//   trellis_worker_bulks_sent_total                  bulk frames sent
// Bands are a few fixed values (SliceQueue::kBandNames), never one per key.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

#include "common/metrics/metrics.h"
#include "worker-lib/src/slice_queue.h"

namespace trellis {

using SliceClock = std::chrono::steady_clock;

inline double SecondsBetween(SliceClock::time_point a, SliceClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class SliceMetrics {
 public:
  static constexpr int kBands = SliceQueue<int>::kBands;

  explicit SliceMetrics(MetricsRegistry& r)
      : wait_(r.Histogram("trellis_worker_slice_wait_seconds",
                          "Time a slice waited in the priority queue before its bytes went out",
                          MetricsRegistry::LatencyBuckets())),
        round_trip_(r.Histogram("trellis_worker_slice_round_trip_seconds",
                                "Time from handing a slice to the transport to its answer",
                                MetricsRegistry::LatencyBuckets())),
        bulks_(r.Counter("trellis_worker_bulks_sent_total",
                         "Bulk frames sent (several small slices in one message)")),
        depth_(MakeDepth(r)) {}

  void ObserveWait(double s) { wait_.Observe(s); }
  void ObserveRoundTrip(double s) { round_trip_.Observe(s); }
  void CountBulk() { bulks_.Increment(); }
  void SetDepth(const std::array<size_t, kBands>& depth) {
    for (int b = 0; b < kBands; ++b) depth_[b]->Set(static_cast<double>(depth[b]));
  }

 private:
  static std::array<prometheus::Gauge*, kBands> MakeDepth(MetricsRegistry& r) {
    std::array<prometheus::Gauge*, kBands> g{};
    for (int b = 0; b < kBands; ++b) {
      g[b] = &r.Gauge("trellis_worker_queue_depth_by_band_slices",
                      "Slices waiting in the worker's priority queue, by priority band "
                      "(0: priority >= 0, 1-9: -1..-9, 10-99, 100+: below -99)",
                      {{"band", SliceQueue<int>::kBandNames[b]}});
    }
    return g;
  }

  prometheus::Histogram& wait_;
  prometheus::Histogram& round_trip_;
  prometheus::Counter& bulks_;
  const std::array<prometheus::Gauge*, kBands> depth_;
};

}  // namespace trellis
