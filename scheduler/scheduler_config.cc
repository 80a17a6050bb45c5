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
  if (e.enabled && (e.min_servers != 0 || e.max_servers != 0) &&
      !(1 <= e.min_servers && e.min_servers <= config.num_servers && config.num_servers <= e.max_servers)) {
    return InvalidArgumentError("elastic bounds must hold 1 <= minServers (" +
                                std::to_string(e.min_servers) + ") <= servers (" +
                                std::to_string(config.num_servers) + ") <= maxServers (" +
                                std::to_string(e.max_servers) + ")");
  }
  return ValidateShardSettings(config.dispatch, config.num_servers, config.slice_bytes);
}

}  // namespace trellis
