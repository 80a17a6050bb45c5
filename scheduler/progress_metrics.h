// The job's progress series (docs/metrics.md, "Job progress"), served by the scheduler: sampled
// from ProgressTracker::Snapshot at each scrape.
#pragma once

#include "common/metrics/metrics.h"
#include "scheduler/progress_tracker.h"
#include "scheduler/scheduler_state.h"

namespace trellis {

// REQUIRES: `progress` and `state` outlive every Serialize() of `registry`.
void RegisterProgressMetrics(MetricsRegistry& registry, const ProgressTracker& progress,
                             const SchedulerState& state);

}  // namespace trellis
