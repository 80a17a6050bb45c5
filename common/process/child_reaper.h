// Reaping children a process did not start. A container's PID 1 (the agent in every server and
// worker pod, the scheduler in its own pod) inherits every orphan of its container: a program
// that leaves children behind, a process started by `kubectl exec` whose parent went away. The
// kernel keeps each as a zombie until PID 1 waits for it, one more per restart of the program,
// until the pid table is full. ChildReaper waits for them (tini's and dumb-init's job), leaving
// the children Subprocess started to their Subprocess (common/process/subprocess.h: ReapEndedChildren).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "common/base/mutex.h"
#include "common/base/status.h"

namespace trellis {

// Makes this process the reaper of its descendants' orphans (PR_SET_CHILD_SUBREAPER), as PID 1
// is: an orphaned grandchild becomes our child instead of init's. Errors: prctl refused.
Status BecomeSubreaper();

// True when this process is PID 1 of its PID namespace (a container's entry point).
bool IsPidOne();

// A thread that reaps every ended child other than the Subprocesses' own, every `interval`.
// REQUIRES: as ReapEndedChildren, every child this process waits for is a Subprocess.
class ChildReaper {
 public:
  explicit ChildReaper(std::chrono::milliseconds interval = std::chrono::milliseconds(200));
  ~ChildReaper();  // stops the thread, after one last round
  ChildReaper(const ChildReaper&) = delete;
  ChildReaper& operator=(const ChildReaper&) = delete;

  // Orphans reaped so far.
  int64_t reaped() const;

 private:
  void Loop();

  const std::chrono::milliseconds interval_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t reaped_ GUARDED_BY(mu_) = 0;
  std::thread thread_;     // last: starts once the rest is ready
};

}  // namespace trellis
