#include "worker-lib/src/deadline_watch.h"

#include <pthread.h>

#include <algorithm>
#include <tuple>

#include "common/base/logging.h"

namespace trellis {

DeadlineWatch::DeadlineWatch(int64_t timeout_ms, PeersRestarting peers_restarting,
                             const ServerSet& servers)
    : timeout_ms_(timeout_ms),
      peers_restarting_(std::move(peers_restarting)),
      servers_(servers),
      thread_([this] {
        pthread_setname_np(pthread_self(), "trellis-watch");
        Loop();
      }) {}

DeadlineWatch::~DeadlineWatch() { Stop(); }

void DeadlineWatch::Watch(const std::shared_ptr<Handle::State>& op) {
  MutexLock lock(&mu_);
  live_.push_back(op);
}

void DeadlineWatch::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void DeadlineWatch::Loop() {
  const auto interval = std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms_ / 10, 1, 100));
  MutexLock lock(&mu_);
  while (!stopping_) {
    cv_.WaitFor(&mu_, interval);
    std::vector<std::shared_ptr<Handle::State>> expired =
        TakeExpiredLocked(Handle::State::Clock::now());
    lock.Unlock();
    for (auto& op : expired) Fail(*op);
    lock.Lock();
  }
}

std::vector<std::shared_ptr<Handle::State>> DeadlineWatch::TakeExpiredLocked(
    Handle::State::Clock::time_point now) {
  // A member being restarted (or back less than one timeout ago): the operations wait for it
  // rather than fail and restart this worker too (docs/scheduler.md#stalls).
  std::chrono::steady_clock::time_point restarting_at{};
  std::string restarting;
  bool asked = false;
  std::vector<std::shared_ptr<Handle::State>> expired;
  for (auto it = live_.begin(); it != live_.end();) {
    auto op = it->lock();
    if (op && !op->closed.load() && now >= op->deadline && peers_restarting_) {
      if (!asked) {
        std::tie(restarting_at, restarting) = peers_restarting_();
        asked = true;
      }
      const auto until = restarting_at + std::chrono::milliseconds(timeout_ms_);
      if (until > now) {
        if (!op->extended) {
          TLOG_WARN << op->what << ": waiting past its deadline for " << restarting
                    << ", which the scheduler is restarting";
        }
        op->extended = true;
        op->deadline = until;
      }
    }
    if (!op || op->closed.load()) {
      it = live_.erase(it);
    } else if (now >= op->deadline) {
      expired.push_back(std::move(op));
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
  return expired;
}

void DeadlineWatch::Fail(Handle::State& op) const {
  int64_t p = op.FirstPending();
  std::string where;
  if (p >= 0) {
    int32_t s = op.slice_server[p];
    where = ": slice " + std::to_string(op.slice_index[p]) + " on server " + std::to_string(s) +
            " (" + servers_.address(s) + ")";
  }
  op.Complete(DeadlineExceededError(op.what + where + " not answered within " +
                                    std::to_string(timeout_ms_) + " ms" +
                                    (op.extended ? " after the restarted member came back" : "")));
}

}  // namespace trellis
