#include "common/process/child_reaper.h"

#include <pthread.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>

#include "common/process/subprocess.h"

namespace trellis {

Status BecomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
    return InternalError(std::string("prctl(PR_SET_CHILD_SUBREAPER): ") + strerror(errno));
  }
  return Status::Ok();
}

bool IsPidOne() { return ::getpid() == 1; }

ChildReaper::ChildReaper(std::chrono::milliseconds interval)
    : interval_(interval), thread_([this] { Loop(); }) {}

ChildReaper::~ChildReaper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t ChildReaper::reaped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reaped_;
}

void ChildReaper::Loop() {
  pthread_setname_np(pthread_self(), "reaper");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const bool stop = cv_.wait_for(lock, interval_, [this] { return stopping_; });
    lock.unlock();
    const int n = ReapEndedChildren();
    lock.lock();
    reaped_ += n;
    if (stop) return;
  }
}

}  // namespace trellis
