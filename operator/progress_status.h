// status.progress and the Straggler condition of a TrainingJob from the scheduler's JobProgress
// (docs/kubernetes.md#progress). Pure: the poller (progress_poller.h) decides when to write.
#pragma once

#include <string>

#include "operator/json_util.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::op {

inline constexpr char kStragglerCondition[] = "Straggler";
// A server or worker program found stalled and being restarted (docs/scheduler.md#stalls).
inline constexpr char kStalledCondition[] = "Stalled";

// The status.progress object: step, totalSteps, samplesPerSecond, loss, eta, etaSeconds,
// stepSeconds, slowestRank, slowestPod, skew (figures rounded so noise alone changes nothing).
Json ProgressJson(const v1::JobProgress& p);

// Writes status.progress and the Straggler condition (True naming the rank and pod; False once
// none is, if the condition was ever set) into `status`. Returns whether anything changed.
bool ApplyProgress(Json& status, const v1::JobProgress& p, Clock::time_point now);

}  // namespace trellis::op
