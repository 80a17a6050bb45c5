// The competing CPU load of `bench_pushpull --load`: what a training host's data loaders and
// framework threads do to the data path. N child processes, each a busy loop (integer work on a
// 64 KiB buffer that stays in the core's L2, no syscalls, default nice), stopped (SIGSTOP)
// except between Resume() and Pause(), so one run measures every figure without and with it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <vector>

#include "common/base/status.h"

namespace trellis::bench {

class CpuLoad {
 public:
  // Forks `processes` stopped children. Call it before the process starts threads (fork copies
  // only the calling thread). Each child dies with this process (PR_SET_PDEATHSIG).
  static StatusOr<std::unique_ptr<CpuLoad>> Start(int processes);
  ~CpuLoad();  // kills and reaps every child
  CpuLoad(const CpuLoad&) = delete;
  CpuLoad& operator=(const CpuLoad&) = delete;

  Status Resume();  // SIGCONT: the children spin
  Status Pause();   // SIGSTOP, and waits until each child is stopped
  int processes() const { return static_cast<int>(children_.size()); }
  const std::vector<pid_t>& pids() const { return children_; }

 private:
  CpuLoad() = default;
  std::vector<pid_t> children_;
};

}  // namespace trellis::bench
