// Notices that the scheduler went away or restarted, and hands state back to the new one
// (docs/scheduler.md#scheduler-restart). Used by the processes that outlive a scheduler crash
// and hold part of the job's state: servers (their data address) and workers (the shard map,
// the servers' addresses). One thread pings the scheduler every `interval`; while it does not
// answer, again with back-off (100 ms doubling up to `interval`, at most 500 ms); when it answers
// with another scheduler id, `on_restart` runs (retried every 200 ms until it succeeds).
// The pings name the process (`identity`): they are its program's own liveness, which the
// scheduler's stall detection watches (docs/scheduler.md#stalls); their answers say which
// members are being restarted, so this process's operations wait for them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "scheduler/scheduler_client.h"

namespace trellis {

class SchedulerWatch {
 public:
  // `client` outlives the watch. `scheduler_id`: the one this process started with (0: learn it
  // from the first answer). `who` names the process in logs ("server 1", "worker 0").
  // `identity`: role, rank and incarnation of this process (role unset: anonymous pings).
  SchedulerWatch(SchedulerClient* client, uint64_t scheduler_id, std::chrono::milliseconds interval,
                 std::function<Status()> on_restart, std::string who,
                 v1::PingRequest identity = v1::PingRequest());
  ~SchedulerWatch();  // stops the thread
  SchedulerWatch(const SchedulerWatch&) = delete;
  SchedulerWatch& operator=(const SchedulerWatch&) = delete;

  // A call just failed as if the scheduler were gone: check now, then wait until the scheduler
  // answers and `on_restart` (if it restarted) is done, at most `wait`. False: not up by then.
  bool WaitUp(std::chrono::milliseconds wait) EXCLUDES(mu_);
  uint64_t scheduler_id() const EXCLUDES(mu_);
  int64_t restarts_seen() const EXCLUDES(mu_);  // schedulers this watch has handed state back to
  // When an answer last listed another member of the job as being restarted (steady clock;
  // the epoch when none ever did), and which ("server 1", "worker 0, worker 1").
  std::chrono::steady_clock::time_point restarting_seen_at() const EXCLUDES(mu_);
  std::string restarting_seen() const EXCLUDES(mu_);
  // Whether an answer said the whole job is being stopped from outside (StopJob); stays true.
  bool job_stopping() const { return job_stopping_.load(std::memory_order_relaxed); }
  // Elastic jobs: the resize the last answer said is under way (0: none; docs/elastic.md).
  int64_t resize_epoch() const { return resize_epoch_.load(std::memory_order_relaxed); }
  // Called on the watch's thread after each answer that says a resize is under way (its epoch).
  void SetResizeListener(std::function<void(int64_t)> listener) EXCLUDES(mu_);
  // Called on the watch's thread after each answer that names workers lost for good (a server
  // stops waiting for their pushes; docs/elastic.md#losing-a-worker).
  void SetLostListener(std::function<void(const std::vector<v1::LostWorker>&)> listener) EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  void NoteRestartingLocked(const v1::PingResponse& ping) REQUIRES(mu_);

  SchedulerClient* const client_;
  const std::chrono::milliseconds interval_;
  const std::function<Status()> on_restart_;
  const std::string who_;
  const v1::PingRequest identity_;

  mutable Mutex mu_;
  CondVar cv_;  // wakes the loop (poke, stop) and WaitUp callers
  uint64_t scheduler_id_ GUARDED_BY(mu_);
  bool up_ GUARDED_BY(mu_) = true;  // answered, state handed back
  bool poked_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t restarts_seen_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point restarting_at_ GUARDED_BY(mu_){};
  std::string restarting_ GUARDED_BY(mu_);  // as restarting_seen() says
  std::atomic<bool> job_stopping_{false};    // read at every step boundary: no lock
  std::atomic<int64_t> resize_epoch_{0};     // likewise
  std::function<void(int64_t)> on_resize_ GUARDED_BY(mu_);
  std::function<void(const std::vector<v1::LostWorker>&)> on_lost_ GUARDED_BY(mu_);
  std::thread thread_;
};

// Whether a scheduler call failed because the scheduler is gone or restarted (UNAVAILABLE; or
// NOT_FOUND: it does not know the caller yet): worth repeating once the watch says it is up.
bool SchedulerGoneOrRestarted(const Status& status);

}  // namespace trellis
