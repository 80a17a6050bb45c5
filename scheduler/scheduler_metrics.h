// The scheduler's series (docs/metrics.md): sampled from SchedulerState::stats() at each scrape,
// so the state keeps plain counters under its own lock and knows nothing of Prometheus.
#pragma once

#include "common/metrics/metrics.h"
#include "scheduler/scheduler_state.h"

namespace trellis {

// Registers the series and an OnCollect hook reading `state`.
// REQUIRES: `state` outlives every Serialize() of `registry` (stop the HTTP server first).
void RegisterSchedulerMetrics(MetricsRegistry& registry, const SchedulerState& state);

}  // namespace trellis
