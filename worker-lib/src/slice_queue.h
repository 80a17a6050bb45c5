// The per-process queue of slices waiting to be sent (P3-style scheduling): highest priority
// first, FIFO within a priority, and at most `water_mark` slices in flight, so a small
// high-priority tensor overtakes the tail of a big one that is still queued.
//
// Non-blocking by design: producers Push then drain with TryPop; whoever Releases a slice's
// place drains again. No dedicated dispatcher thread is needed, and any thread may pop.
// What "in flight" means is the caller's: the worker releases a place once the slice's bytes
// went to the kernel (transport.h, SliceSent), not when the answer came back, so answers that
// wait for the other workers' pushes hold no place and workers' queues stay independent.
// Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include "common/base/by_priority.h"
#include "common/base/mutex.h"

namespace trellis {

template <typename T>
class SliceQueue {
 public:
  // water_mark < 1 is treated as 1.
  explicit SliceQueue(int water_mark) : water_mark_(water_mark < 1 ? 1 : water_mark) {}

  // Priority bands for the depth metric (a few fixed values, never one per key): priorities
  // >= 0 (layer 0, broadcasts), -1..-9, -10..-99, below -99 (priority = -layer by default).
  static constexpr int kBands = 4;
  static constexpr std::array<const char*, kBands> kBandNames = {"0", "1-9", "10-99", "100+"};
  static int Band(int priority) {
    return priority >= 0 ? 0 : priority > -10 ? 1 : priority > -100 ? 2 : 3;
  }

  void Push(int priority, T item) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    heap_.push(Entry{priority, seq_++, std::move(item)});
    ++band_depth_[Band(priority)];
  }

  // The next slice to send, counted as in flight; nullopt when nothing is queued or
  // water_mark slices are already in flight.
  std::optional<T> TryPop() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (heap_.empty() || in_flight_ >= water_mark_) return std::nullopt;
    T item = std::move(const_cast<Entry&>(heap_.top()).value);
    --band_depth_[Band(heap_.top().priority)];
    heap_.pop();
    ++in_flight_;
    return item;
  }

  // Like TryPop, without taking a place, and only if the next item is the highest-priority one
  // and `fits(item)` holds: how a bulk grows from consecutive pops without jumping the order.
  template <typename Fits>
  std::optional<T> TryPopIf(Fits fits) EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (heap_.empty() || !fits(heap_.top().value)) return std::nullopt;
    T item = std::move(const_cast<Entry&>(heap_.top()).value);
    --band_depth_[Band(heap_.top().priority)];
    heap_.pop();
    return item;
  }

  // Everything still queued, whatever is in flight (shutdown: fail it all).
  std::vector<T> TakeAll() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    std::vector<T> out;
    while (!heap_.empty()) {
      out.push_back(std::move(const_cast<Entry&>(heap_.top()).value));
      heap_.pop();
    }
    band_depth_ = {};
    return out;
  }

  // A popped slice's place is free again (its bytes went out, or it failed).
  void Release() EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (in_flight_ > 0) --in_flight_;
  }

  size_t queued() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return heap_.size();
  }
  int in_flight() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return in_flight_;
  }
  int water_mark() const { return water_mark_; }
  std::array<size_t, kBands> queued_by_band() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return band_depth_;
  }

 private:
  using Entry = ByPriority<T>;

  const int water_mark_;
  mutable Mutex mu_;
  std::priority_queue<Entry> heap_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  int in_flight_ GUARDED_BY(mu_) = 0;
  std::array<size_t, kBands> band_depth_ GUARDED_BY(mu_){};
};

}  // namespace trellis
