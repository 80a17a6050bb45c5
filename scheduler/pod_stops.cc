#include "scheduler/pod_stops.h"

#include <algorithm>
#include <cstdio>

namespace trellis {
namespace {

// "2 s", "2.5 s", "27 s".
std::string Secs(std::chrono::milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", Seconds(d));
  return buf;
}

}  // namespace

PodStops::PodStops(int32_t num_servers, int32_t num_workers, std::chrono::milliseconds window,
                   std::chrono::milliseconds limit)
    : window_(window), limit_(limit) {
  asked_[0].resize(static_cast<size_t>(std::max(num_servers, 0)));
  asked_[1].resize(static_cast<size_t>(std::max(num_workers, 0)));
}

PodStops::Verdict PodStops::Ask(v1::Role role, int32_t rank, const JobState& job, TimePoint now) {
  auto& mine = asked_[role == v1::ROLE_SERVER ? 0 : 1][static_cast<size_t>(rank)];
  if (!mine) mine = now;
  if (!first_) first_ = now;
  Verdict v;
  if (!job.training) {
    v.reason = "the job's workers have finished";
    return v;
  }
  if (job.exit_written) {
    v.reason = "rank 0's exit checkpoint is written";
    return v;
  }
  if (!job.exit_ready) {
    v.reason = "rank 0 writes no exit checkpoint (no trellis::Checkpointer, nor a trellis.torch TrainingState with a checkpoint file)";
    return v;
  }
  const TimePoint since = job.stopping ? std::min(*first_, job.stopping_since) : *first_;
  if (now - since >= limit_) {
    v.reason = "no exit checkpoint within " + Secs(limit_) + " of the job's stop";
    return v;
  }
  const bool every_worker = std::all_of(asked_[1].begin(), asked_[1].end(),
                                        [](const std::optional<TimePoint>& t) { return t.has_value(); });
  if (job.stopping || every_worker) {
    v.wait = true;
    v.stop_job = !job.stopping;
    v.reason = job.stopping ? "the job is being stopped: waiting for rank 0's exit checkpoint"
                            : "every worker's pod is being stopped: the whole job stops after rank 0's exit checkpoint";
    return v;
  }
  if (now - *mine < window_) {
    v.wait = true;
    v.reason = "waiting up to " + Secs(window_) + " to see whether the whole job is being stopped";
    return v;
  }
  v.reason = "only some of the job's pods are being stopped: the job goes on, their replacements rejoin it";
  return v;
}

}  // namespace trellis
