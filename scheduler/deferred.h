// How the scheduler's state answers a call that may wait: a Reply<T> called exactly once, never
// with the state's lock held (a reply may call back in). Answers found under the lock are
// collected in a Deferred and run once the lock is released.
#pragma once

#include <functional>
#include <vector>

#include "common/base/status.h"

namespace trellis {

template <typename T>
using Reply = std::function<void(StatusOr<T>)>;

// Work to do once the lock is released (replies), in the order it was added.
using Deferred = std::vector<std::function<void()>>;

inline void RunDeferred(Deferred& deferred) {
  for (auto& f : deferred) f();
  deferred.clear();
}

}  // namespace trellis
