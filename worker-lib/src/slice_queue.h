// The per-process queue of slices waiting to be sent (P3-style scheduling): highest priority
// first, FIFO within a priority, and at most `water_mark` slices in flight, so a small
// high-priority tensor overtakes the tail of a big one that is still queued.
//
// Non-blocking by design: producers Push then drain with TryPop; whoever Releases a finished
// slice drains again. No dedicated dispatcher thread is needed, and any thread may pop.
// Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace trellis {

template <typename T>
class SliceQueue {
 public:
  // water_mark < 1 is treated as 1.
  explicit SliceQueue(int water_mark) : water_mark_(water_mark < 1 ? 1 : water_mark) {}

  void Push(int priority, T item) {
    std::lock_guard lock(mu_);
    heap_.push(Entry{priority, seq_++, std::move(item)});
  }

  // The next slice to send, counted as in flight; nullopt when nothing is queued or
  // water_mark slices are already in flight.
  std::optional<T> TryPop() {
    std::lock_guard lock(mu_);
    if (heap_.empty() || in_flight_ >= water_mark_) return std::nullopt;
    T item = std::move(const_cast<Entry&>(heap_.top()).item);
    heap_.pop();
    ++in_flight_;
    return item;
  }

  // A popped slice finished (answered or failed); frees its place.
  void Release() {
    std::lock_guard lock(mu_);
    if (in_flight_ > 0) --in_flight_;
  }

  size_t queued() const {
    std::lock_guard lock(mu_);
    return heap_.size();
  }
  int in_flight() const {
    std::lock_guard lock(mu_);
    return in_flight_;
  }
  int water_mark() const { return water_mark_; }

 private:
  struct Entry {
    int priority;
    uint64_t seq;
    T item;
    // std::priority_queue is a max-heap: "less" = lower priority, or same priority and later.
    bool operator<(const Entry& o) const {
      return priority != o.priority ? priority < o.priority : seq > o.seq;
    }
  };

  const int water_mark_;
  mutable std::mutex mu_;
  std::priority_queue<Entry> heap_;  // GUARDED_BY(mu_)
  uint64_t seq_ = 0;                 // GUARDED_BY(mu_)
  int in_flight_ = 0;                // GUARDED_BY(mu_)
};

}  // namespace trellis
