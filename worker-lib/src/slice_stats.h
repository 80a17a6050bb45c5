// Timing of the worker's slices: how long a slice waited in the priority queue before its bytes
// went out (queued -> sent), and its round trip (handed to the transport -> answered). Lock-free
// counters read by tests and exported as metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace trellis {

using SliceClock = std::chrono::steady_clock;

inline double SecondsBetween(SliceClock::time_point a, SliceClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class SliceStats {
 public:
  struct Summary {
    uint64_t count = 0;
    double sum_s = 0;
  };

  void ObserveWait(double s) { Add(wait_, s); }
  void ObserveRoundTrip(double s) { Add(rtt_, s); }
  Summary wait() const { return Read(wait_); }
  Summary round_trip() const { return Read(rtt_); }

 private:
  struct Cell {
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_ns{0};
  };
  static void Add(Cell& c, double s) {
    c.count.fetch_add(1, std::memory_order_relaxed);
    c.sum_ns.fetch_add(static_cast<uint64_t>(s > 0 ? s * 1e9 : 0), std::memory_order_relaxed);
  }
  static Summary Read(const Cell& c) {
    return {c.count.load(std::memory_order_relaxed),
            static_cast<double>(c.sum_ns.load(std::memory_order_relaxed)) / 1e9};
  }

  Cell wait_;
  Cell rtt_;
};

}  // namespace trellis
