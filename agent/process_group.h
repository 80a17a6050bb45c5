// A multi-GPU worker pod runs G copies of the training command, one per GPU (local ranks
// 0..G-1). ProcessGroupSpawner starts them as one Process for the Supervisor, so the restart
// policy applies to the pod's group as a whole: the first copy that fails ends the group (the
// others get SIGTERM, then SIGKILL after the grace period) with that copy's exit status; the
// group succeeds when every copy exits 0.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/process/subprocess.h"

namespace trellis {

class ProcessGroup : public Process {
 public:
  // Waiting (Poll/WaitFor) is for one thread; Signal may come from any thread.
  ProcessGroup(std::vector<std::unique_ptr<Subprocess>> children, std::string group_name,
               std::chrono::milliseconds grace);
  ~ProcessGroup() override;

  pid_t pid() const override { return children_.front()->pid(); }
  std::optional<ExitStatus> Poll() override { return WaitFor(std::chrono::milliseconds(0)); }
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout) override;
  Status Signal(int signo) override;

 private:
  std::vector<std::unique_ptr<Subprocess>> children_;
  const std::string group_name_;
  const std::chrono::milliseconds grace_;
  std::vector<std::optional<ExitStatus>> ended_;   // per child; waiter thread only
  std::optional<ExitStatus> first_failure_;        // waiter thread only
  std::optional<std::chrono::steady_clock::time_point> kill_at_;  // waiter thread only
};

// Starts `size` copies of the program with TRELLIS_LOCAL_RANK, TRELLIS_LOCAL_SIZE and
// TRELLIS_LOCAL_GROUP (taken from the options' environment, else "local") in their environment;
// copies after the first get a free TRELLIS_METRICS_PORT of their own.
class ProcessGroupSpawner : public ProcessSpawner {
 public:
  ProcessGroupSpawner(int size, std::chrono::milliseconds grace) : size_(size), grace_(grace) {}
  StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override;

 private:
  const int size_;
  const std::chrono::milliseconds grace_;
};

}  // namespace trellis
