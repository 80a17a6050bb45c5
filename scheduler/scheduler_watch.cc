#include "scheduler/scheduler_watch.h"

#include <pthread.h>

#include <algorithm>

#include "common/base/logging.h"

namespace trellis {

using std::chrono::milliseconds;

bool SchedulerGoneOrRestarted(const Status& status) {
  return status.code() == StatusCode::kUnavailable || status.code() == StatusCode::kNotFound;
}

SchedulerWatch::SchedulerWatch(SchedulerClient* client, uint64_t scheduler_id,
                               milliseconds interval, std::function<Status()> on_restart,
                               std::string who, v1::PingRequest identity)
    : client_(client),
      interval_(std::max(interval, milliseconds(50))),
      on_restart_(std::move(on_restart)),
      who_(std::move(who)),
      identity_(std::move(identity)),
      scheduler_id_(scheduler_id) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "trellis-schedw");
    Loop();
  });
}

SchedulerWatch::~SchedulerWatch() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

uint64_t SchedulerWatch::scheduler_id() const {
  MutexLock lock(&mu_);
  return scheduler_id_;
}

int64_t SchedulerWatch::restarts_seen() const {
  MutexLock lock(&mu_);
  return restarts_seen_;
}

std::chrono::steady_clock::time_point SchedulerWatch::restarting_seen_at() const {
  MutexLock lock(&mu_);
  return restarting_at_;
}

std::string SchedulerWatch::restarting_seen() const {
  MutexLock lock(&mu_);
  return restarting_;
}

bool SchedulerWatch::WaitUp(milliseconds wait) {
  // From a listener, on the watch's own thread: nothing else pings while it waits, so it would
  // wait all of `wait` (a worker's resize report made before its agent registered again with a
  // restarted scheduler stalled every thread of the worker for 60 s). Not up: the caller's
  // retry asks again after its pause.
  if (std::this_thread::get_id() == thread_.get_id()) return false;
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  // The caller's failure is news the loop may not have yet: check now, and count as down until
  // a ping answers.
  poked_ = true;
  up_ = false;
  cv_.SignalAll();
  while (!up_ && !stopping_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;  // timed out: up_ says
  }
  return up_;
}

void SchedulerWatch::NoteRestartingLocked(const v1::PingResponse& ping) {
  std::string names;
  auto note = [&](const google::protobuf::RepeatedField<int32_t>& ranks, v1::Role role) {
    for (int32_t r : ranks) {
      if (role == identity_.role() && r == identity_.rank()) continue;  // not waiting on itself
      names += (names.empty() ? "" : ", ") +
               std::string(role == v1::ROLE_SERVER ? "server " : "worker ") + std::to_string(r);
    }
  };
  note(ping.restarting_servers(), v1::ROLE_SERVER);
  note(ping.restarting_workers(), v1::ROLE_WORKER);
  if (names.empty()) return;
  restarting_at_ = std::chrono::steady_clock::now();
  restarting_ = std::move(names);
}

void SchedulerWatch::Loop() {
  milliseconds backoff(100);
  std::chrono::steady_clock::time_point lost_at{};
  bool lost_logged = false;
  bool handback_logged = false;  // once per restart: it is retried every 200 ms until taken
  MutexLock lock(&mu_);
  // The first ping goes out at once: it is the program's first sign of life, and a program
  // that never pinged is not judged for stalls (one stopped within its first interval, under
  // load, went undetected and its peers failed instead of waiting for it).
  bool first = true;
  while (!stopping_) {
    const milliseconds pause = up_ ? interval_ : backoff;
    if (!first) {
      const auto until = std::chrono::steady_clock::now() + pause;
      while (!stopping_ && !poked_) {
        if (!cv_.WaitUntil(&mu_, until)) break;
      }
    }
    first = false;
    if (stopping_) return;
    poked_ = false;
    const uint64_t known = scheduler_id_;
    lock.Unlock();
    auto ping = client_->Ping(identity_);
    Status handed = Status::Ok();
    bool restarted = false;
    if (ping.ok() && known != 0 && ping->scheduler_id() != known) {
      restarted = true;
      if (!handback_logged) {
        TLOG_WARN << who_ << ": the scheduler restarted; handing back this process's state";
        handback_logged = true;
      }
      handed = on_restart_ ? on_restart_() : Status::Ok();
    }
    lock.Lock();
    if (!ping.ok() || !handed.ok()) {
      if (!lost_logged) {
        lost_at = std::chrono::steady_clock::now();
        TLOG_WARN << who_ << ": "
                  << (ping.ok() ? "handing state back to the restarted scheduler: " + handed.ToString()
                                : "scheduler unreachable (" + ping.status().ToString() + ")")
                  << "; retrying with back-off";
        lost_logged = true;
      }
      up_ = false;
      // It answers but does not take our state yet (our agent has not registered again): soon
      // again. Gone: back off, at most 500 ms between tries, so a restart is found quickly.
      backoff = ping.ok() ? milliseconds(200) : std::min({backoff * 2, interval_, milliseconds(500)});
      continue;
    }
    backoff = milliseconds(100);
    scheduler_id_ = ping->scheduler_id();
    NoteRestartingLocked(*ping);
    if (ping->stopping()) job_stopping_.store(true, std::memory_order_relaxed);
    resize_epoch_.store(ping->resize_epoch(), std::memory_order_relaxed);
    if (restarted) ++restarts_seen_;
    if (lost_logged || restarted) {
      const double secs = lost_logged ? std::chrono::duration<double>(
                                            std::chrono::steady_clock::now() - lost_at)
                                            .count()
                                      : 0.0;
      TLOG_INFO << who_ << ": " << (restarted ? "resumed with the restarted scheduler"
                                              : "the scheduler answers again")
                << (lost_logged ? " after " + std::to_string(secs) + " s" : std::string());
    }
    lost_logged = false;
    handback_logged = false;
    up_ = true;
    cv_.SignalAll();
    if (ping->resize_epoch() > 0 && on_resize_) {
      // Called without the lock: it may call the scheduler (a worker's report of its step).
      auto listener = on_resize_;
      const int64_t epoch = ping->resize_epoch();
      lock.Unlock();
      listener(epoch);
      lock.Lock();
    }
    if (ping->lost_workers_size() > 0 && on_lost_) {
      auto listener = on_lost_;
      const std::vector<v1::LostWorker> lost(ping->lost_workers().begin(), ping->lost_workers().end());
      lock.Unlock();
      listener(lost);
      lock.Lock();
    }
  }
}

void SchedulerWatch::SetLostListener(std::function<void(const std::vector<v1::LostWorker>&)> listener) {
  MutexLock lock(&mu_);
  on_lost_ = std::move(listener);
}

void SchedulerWatch::SetResizeListener(std::function<void(int64_t)> listener) {
  MutexLock lock(&mu_);
  on_resize_ = std::move(listener);
}

}  // namespace trellis
