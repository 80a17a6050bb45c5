#include "bench/common/poll.h"

#include <thread>

namespace trellis::bench {

bool IsTransientPollError(const Status& status) {
  return status.code() == StatusCode::kDeadlineExceeded || status.code() == StatusCode::kUnavailable;
}

Status PollUntil(const std::function<StatusOr<bool>()>& poll, std::chrono::milliseconds total,
                 const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + total;
  Status last;
  do {
    StatusOr<bool> done = poll();
    if (done.ok()) {
      if (*done) return Status::Ok();
      continue;
    }
    if (!IsTransientPollError(done.status())) return done.status();
    last = done.status();
    // A poll refused at once (UNAVAILABLE) would otherwise spin until the deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  std::string message = what + " within " + std::to_string(total.count()) + " ms";
  if (!last.ok()) message += " (last poll: " + last.ToString() + ")";
  return DeadlineExceededError(message);
}

}  // namespace trellis::bench
