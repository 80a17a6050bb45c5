#include "scheduler/restart_recovery.h"

#include "common/base/logging.h"

namespace trellis {

bool RestartRecovery::Begin(TimePoint now, const std::string& why) {
  if (restarted_) return false;
  restarted_ = true;
  recovering_ = true;
  ++recoveries_;
  start_ = now;
  deadline_ = start_ + config_.recovery_grace;
  TLOG_WARN << "the job was running before this scheduler started (" << why
            << "): recovering its state from the members; waiting up to "
            << Seconds(config_.recovery_grace) << " s for all " << config_.num_servers << " servers and "
            << (config_.elastic.enabled ? std::string("the workers of the world they hand back")
                                        : std::to_string(config_.num_workers) + " workers")
            << " to register again";
  return true;
}

bool RestartRecovery::End(bool all_back, TimePoint now, double* seconds) {
  if (!recovering_) return false;
  if (!all_back && now < deadline_) return false;
  recovering_ = false;
  *seconds = Seconds(now - start_);
  return true;
}

void RestartRecovery::AddTo(SchedulerStats* stats) const {
  stats->recoveries += recoveries_;
  stats->recovering = recovering_;
}

}  // namespace trellis
