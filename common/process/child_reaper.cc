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
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

int64_t ChildReaper::reaped() const {
  MutexLock lock(&mu_);
  return reaped_;
}

void ChildReaper::Loop() {
  pthread_setname_np(pthread_self(), "reaper");
  MutexLock lock(&mu_);
  while (true) {
    const auto wake = std::chrono::steady_clock::now() + interval_;
    while (!stopping_ && cv_.WaitUntil(&mu_, wake)) {
    }
    const bool stop = stopping_;
    lock.Unlock();
    const int n = ReapEndedChildren();
    lock.Lock();
    reaped_ += n;
    if (stop) return;
  }
}

}  // namespace trellis
