// Recovering a running job after the scheduler restarted (docs/scheduler.md#scheduler-restart).
// A restarted scheduler knows nothing; the members do. Agents register again with the rank and
// incarnation they hold (Membership::Adopt), servers report ready again, workers hand back the
// shard map and the servers' addresses (Resume). This object is the phase: whether the job ran
// before this scheduler (restarted), and the grace period until every member is back or the
// deadline passes (recovering), in which nobody is declared dead.
//
// Not thread-safe: SchedulerState calls it with its one lock held.
#pragma once

#include <string>

#include "scheduler/clock.h"
#include "scheduler/scheduler_config.h"

namespace trellis {

class RestartRecovery {
 public:
  using TimePoint = Clock::TimePoint;

  // `config` outlives the recovery.
  explicit RestartRecovery(const SchedulerConfig& config) : config_(config) {}

  // The first sign that the job ran before this scheduler (`why`, for the log) opens the grace
  // period. Returns true only the first time.
  bool Begin(TimePoint now, const std::string& why);
  bool restarted() const { return restarted_; }
  bool recovering() const { return recovering_; }
  // Everyone is back, or the grace is over: the recovery ends. Returns false while it goes on
  // (or none runs); else ends it and sets *seconds to how long it took.
  bool End(bool all_back, TimePoint now, double* seconds);

  void AddTo(SchedulerStats* stats) const;

 private:
  const SchedulerConfig& config_;
  bool restarted_ = false;
  bool recovering_ = false;
  TimePoint start_{};
  TimePoint deadline_{};
  int64_t recoveries_ = 0;
};

}  // namespace trellis
