// What a parameter server's slice store is configured with (pserver/slice_store.h), shared by
// its parts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/job/job_spec.h"
#include "common/metrics/metrics.h"

namespace trellis {

struct StoreConfig {
  int32_t server_rank = 0;
  int32_t num_workers = 1;  // the workers it starts with: ranks 0..num_workers-1
  // The worker ranks (slots) there may ever be: an elastic job's most workers; 0: num_workers.
  // Which of them take part in a step is the store's WorldSchedule (pserver/world_schedule.h).
  int32_t worker_slots = 0;
  int32_t slots() const { return worker_slots > num_workers ? worker_slots : num_workers; }
  ServerMode mode = ServerMode::kAggregate;
  OptimizerSpec optimizer;
  // The process's metrics (role server); null: the store keeps its own.
  std::shared_ptr<MetricsRegistry> metrics;
  std::string checkpoint_path;  // the job's spec.checkpoint.path; empty: SAVE/LOAD refused
  int32_t checkpoint_keep = 3;
};

}  // namespace trellis
