// The deadlines of a worker's operations: one thread ("trellis-watch") fails an operation whose
// deadline passed with DEADLINE_EXCEEDED, naming the first slice not answered and its server.
// While the scheduler says a member of the job is being restarted (or was, less than one timeout
// ago), a passed deadline moves instead, once logged (docs/scheduler.md#stalls).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "worker-lib/src/op_state.h"
#include "worker-lib/src/server_set.h"

namespace trellis {

class DeadlineWatch {
 public:
  // When the scheduler last said a member is being restarted, and which (null: never).
  using PeersRestarting =
      std::function<std::pair<std::chrono::steady_clock::time_point, std::string>()>;

  // Starts the thread; it looks every timeout/10 (1 to 100 ms). `servers` outlives the watch.
  DeadlineWatch(int64_t timeout_ms, PeersRestarting peers_restarting, const ServerSet& servers);
  ~DeadlineWatch();  // Stop
  DeadlineWatch(const DeadlineWatch&) = delete;
  DeadlineWatch& operator=(const DeadlineWatch&) = delete;

  // Watches `op` until it completes or its deadline passes.
  void Watch(const std::shared_ptr<Handle::State>& op) EXCLUDES(mu_);
  // Ends the thread (operations still live are not failed); a second call does nothing.
  void Stop() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  // Drops completed operations, moves deadlines while a member is being restarted, and takes
  // the operations whose deadline passed at `now`.
  std::vector<std::shared_ptr<Handle::State>> TakeExpiredLocked(Handle::State::Clock::time_point now)
      REQUIRES(mu_);
  void Fail(Handle::State& op) const;

  const int64_t timeout_ms_;
  const PeersRestarting peers_restarting_;
  const ServerSet& servers_;

  Mutex mu_;
  CondVar cv_;
  std::list<std::weak_ptr<Handle::State>> live_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it starts once the rest is made
};

}  // namespace trellis
