// The one place where a complete step of a slice becomes its result, for a step the workers'
// pushes completed (StepProtocol::Push) and for one rebuilt from their replays (SliceRebuild):
// `aggregate` mode publishes the sum of the step's W pushes as it is; `update` mode applies the
// optimizer (pserver/optimizer.h) to their mean, sum / W, on the slice's weights and publishes
// the new weights. W is the size of the step's world (pserver/world_schedule.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/job/job_spec.h"
#include "pserver/slice.h"
#include "pserver/store_config.h"

namespace trellis {

class StepUpdate {
 public:
  explicit StepUpdate(const StoreConfig& config)
      : mode_(config.mode), optimizer_(config.optimizer) {}

  // The result of `step` from `sum`, its sum over the step's `pushers` workers. Aggregate mode:
  // the sum itself (*sum is taken, left null); update mode: *sum is scaled to the mean in place
  // and applied to *weights, and stays the caller's (a spare buffer for the next step).
  Values Apply(int64_t step, int32_t pushers, std::unique_ptr<std::vector<float>>* sum,
               SliceWeights* weights) const;

 private:
  const ServerMode mode_;
  const OptimizerSpec optimizer_;
};

}  // namespace trellis
