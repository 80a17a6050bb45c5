// A worker's side of a scheduler restart (docs/scheduler.md#scheduler-restart): it holds what
// this worker knows of the job's state -- the shard map the servers hold, the servers' data
// addresses -- hands it back when a restarted scheduler answers (Resume), and repeats the calls
// that failed because the scheduler was gone or did not know this worker yet.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_watch.h"

namespace trellis {

class SchedulerSession {
 public:
  // Learns the scheduler's id (a Ping) and starts watching it every `ping_interval`.
  static StatusOr<std::shared_ptr<SchedulerSession>> Start(std::shared_ptr<SchedulerClient> client,
                                                           int32_t rank, int64_t incarnation,
                                                           std::chrono::milliseconds ping_interval);
  ~SchedulerSession();

  SchedulerClient& client() { return *client_; }

  // Runs `call(time left)` until it succeeds, fails for another reason than the scheduler being
  // gone or restarted (SchedulerGoneOrRestarted), or `wait` has passed.
  template <typename R>
  R Call(const std::function<R(std::chrono::milliseconds)>& call, std::chrono::milliseconds wait);

  // When the scheduler last said another member is being restarted, and which (SchedulerWatch).
  std::pair<std::chrono::steady_clock::time_point, std::string> PeersRestarting() const {
    return {watch_->restarting_seen_at(), watch_->restarting_seen()};
  }

  // Whether the scheduler said the whole job is being stopped from outside (StopJob).
  bool JobStopping() const { return watch_->job_stopping(); }
  // The resize the scheduler says is under way (0: none; docs/elastic.md).
  int64_t ResizeEpoch() const { return watch_->resize_epoch(); }
  // Called on the watch's thread while the pings say a resize is under way (world_switch.h).
  void SetResizeListener(std::function<void(int64_t)> listener) {
    watch_->SetResizeListener(std::move(listener));
  }

  // What this worker holds, for a restarted scheduler.
  void HoldShardMap(const v1::ShardMap& map) EXCLUDES(mu_);
  void HoldServerAddresses(const std::vector<std::string>& addresses) EXCLUDES(mu_);
  void HoldServerAddress(int32_t server, const std::string& address) EXCLUDES(mu_);
  // Elastic jobs: where the world this worker is in comes from (called at each hand-back).
  void HoldWorld(std::function<v1::WorldInfo()> world) EXCLUDES(mu_);

 private:
  SchedulerSession(std::shared_ptr<SchedulerClient> client, int32_t rank, int64_t incarnation);
  // Waits for the scheduler (at most `left`), then a little: NOT_FOUND while it answers means
  // this worker's agent has not registered again yet.
  void AwaitScheduler(std::chrono::milliseconds left);
  Status HandBack() EXCLUDES(mu_);

  const std::shared_ptr<SchedulerClient> client_;
  const int32_t rank_;
  const int64_t incarnation_;
  Mutex mu_;
  std::optional<v1::ShardMap> map_ GUARDED_BY(mu_);
  std::vector<std::string> addresses_ GUARDED_BY(mu_);  // index = server rank
  std::function<v1::WorldInfo()> world_ GUARDED_BY(mu_);  // null: not elastic
  std::unique_ptr<SchedulerWatch> watch_;  // last: its thread stops before the rest goes
};

template <typename R>
R SchedulerSession::Call(const std::function<R(std::chrono::milliseconds)>& call,
                         std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    R r = call(std::max(left, std::chrono::milliseconds(1)));
    Status st;
    if constexpr (std::is_same_v<R, Status>) {
      st = r;
    } else {
      st = r.status();
    }
    if (st.ok() || !SchedulerGoneOrRestarted(st) || std::chrono::steady_clock::now() >= deadline) {
      return r;
    }
    AwaitScheduler(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
  }
}

}  // namespace trellis
