// A start-up wait made of short polls, bounded by one total deadline rather than by the first
// slow answer. On a loaded machine one poll's reply can arrive after that poll's own deadline
// (DEADLINE_EXCEEDED) or find the peer momentarily unreachable (UNAVAILABLE); the next poll
// retries. Any other error ends the wait at once.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/base/status.h"

namespace trellis::bench {

// True for the errors one poll may return on a busy machine without anything being wrong.
bool IsTransientPollError(const Status& status);

// Calls `poll` until it returns true, returns a non-transient error, or `total` has passed
// (then DEADLINE_EXCEEDED naming `what` and the last transient error, if any). `poll` should
// bound each call itself (a long poll of well under `total`).
Status PollUntil(const std::function<StatusOr<bool>()>& poll, std::chrono::milliseconds total,
                 const std::string& what);

}  // namespace trellis::bench
