#include "scheduler/scheduler_config.h"

#include "scheduler/shard_map.h"

namespace trellis {

Status ValidateSchedulerConfig(const SchedulerConfig& config) {
  if (config.num_servers < 1) {
    return InvalidArgumentError("number of servers must be >= 1, got " +
                                std::to_string(config.num_servers));
  }
  if (config.num_workers < 1) {
    return InvalidArgumentError("number of workers must be >= 1, got " +
                                std::to_string(config.num_workers));
  }
  if (config.replacement_timeout.count() <= 0) {
    return InvalidArgumentError("replacement timeout must be > 0, got " +
                                std::to_string(config.replacement_timeout.count()) + " ms");
  }
  if (config.heartbeat_timeout.count() <= 0) {
    return InvalidArgumentError("heartbeat timeout must be > 0, got " +
                                std::to_string(config.heartbeat_timeout.count()) + " ms");
  }
  const ElasticBounds& e = config.elastic;
  if (e.enabled && !(1 <= e.min_workers && e.min_workers <= config.num_workers &&
                     config.num_workers <= e.max_workers)) {
    return InvalidArgumentError("elastic bounds must hold 1 <= minWorkers (" +
                                std::to_string(e.min_workers) + ") <= workers (" +
                                std::to_string(config.num_workers) + ") <= maxWorkers (" +
                                std::to_string(e.max_workers) + ")");
  }
  return ValidateShardSettings(config.dispatch, config.num_servers, config.slice_bytes);
}

}  // namespace trellis
