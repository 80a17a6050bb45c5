// Pods stopped from outside (PodStopping: their agents got SIGTERM). When every worker's pod is
// being stopped -- a queue deleting the job's pods, `kubectl delete pods`, the node pool drained
// -- the whole job is, and it gets an exit checkpoint as a StopJob would give it
// (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint): every agent keeps its program running
// until rank 0 has written it. When only some pods are, the job goes on and their replacements
// rejoin it; those pods wait `window` at most (for the others to follow), never longer.
// Not thread-safe: SchedulerState calls it under its lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scheduler/clock.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class PodStops {
 public:
  using TimePoint = Clock::TimePoint;
  // `window`: how long a pod waits for the others to follow; `limit`: how long anyone waits for
  // the exit checkpoint, from the first pod's stop (the pods' grace less a margin to exit in).
  PodStops(int32_t num_servers, int32_t num_workers, std::chrono::milliseconds window,
           std::chrono::milliseconds limit);

  struct JobState {
    bool training = true;       // no worker has exited for good (the job is not ending anyway)
    bool stopping = false;      // StopJob was called (or this decided it)
    TimePoint stopping_since{};  // when, if stopping
    bool exit_ready = false;    // rank 0 writes exit checkpoints (C++ Checkpointer, trellis.torch)
    bool exit_written = false;  // rank 0 reported the exit checkpoint
  };
  struct Verdict {
    bool wait = false;      // keep the program running and ask again
    bool stop_job = false;  // every worker's pod is being stopped: stop the whole job now
    std::string reason;
  };
  // Member (role, rank) asks, `now`. REQUIRES: role and rank are valid for the job.
  Verdict Ask(v1::Role role, int32_t rank, const JobState& job, TimePoint now);
  std::chrono::milliseconds window() const { return window_; }
  std::chrono::milliseconds limit() const { return limit_; }

 private:
  const std::chrono::milliseconds window_;
  const std::chrono::milliseconds limit_;
  std::vector<std::optional<TimePoint>> asked_[2];  // [0] servers, [1] workers: first ask per rank
  std::optional<TimePoint> first_;                 // of any pod
};

}  // namespace trellis
