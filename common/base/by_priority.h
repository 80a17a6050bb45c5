// An entry of a queue served highest priority first, FIFO (lower seq first) within a priority:
// std::priority_queue<ByPriority<T>> is a max-heap in that order. The one ordering rule of the
// worker's slice queue and the server's serving queue and answer queues.
#pragma once

#include <cstdint>

namespace trellis {

template <typename T>
struct ByPriority {
  int32_t priority;
  uint64_t seq;  // the order of arrival
  T value;
  bool operator<(const ByPriority& o) const {
    return priority != o.priority ? priority < o.priority : seq > o.seq;
  }
};

}  // namespace trellis
