// Helpers of the elastic-job tests on the scheduler (world_plan_test, world_loss_test).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/scheduler_config.h"
#include "scheduler/scheduler_state.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::elastic_testing {

inline ElasticBounds Bounds(int32_t lo, int32_t hi) { return ElasticBounds{true, lo, hi}; }

inline std::vector<int32_t> Members(const v1::WorldInfo& w) {
  return std::vector<int32_t>(w.members().begin(), w.members().end());
}

// Registers the pods of a job of `workers` workers and one server ("job-worker-<i>",
// "job-server-0"), as their agents do.
inline void RegisterPods(SchedulerState* state, int32_t workers) {
  for (int i = 0; i < workers; ++i) {
    v1::RegisterRequest req;
    req.set_role(v1::ROLE_WORKER);
    req.set_pod_name("job-worker-" + std::to_string(i));
    ASSERT_TRUE(state->Register(req).ok());
  }
  v1::RegisterRequest s;
  s.set_role(v1::ROLE_SERVER);
  s.set_pod_name("job-server-0");
  ASSERT_TRUE(state->Register(s).ok());
}

}  // namespace trellis::elastic_testing
