// Runs one TrainingJob across the project's test hosts (bench/common/testhosts.sh): the
// scheduler and server 0 on host 0, server i on host i, worker i on host S+i, each process
// started through `ip netns exec` with the launcher's own plans (launcher/plan.h), so every
// worker and server sends and receives through its own rate-limited link.
#pragma once

#include <chrono>
#include <string>

#include "common/base/status.h"

namespace trellis::bench {

struct NetnsJobOptions {
  std::string prefix;        // test hosts <prefix>-h<i>, address 198.18.0.<i+1>
  std::string bin_dir;       // trellis-scheduler, trellis-agent, trellis-pserver
  std::string run_dir;       // created; logs, token, port file
  std::string job_file;      // the job (its workers' command is run by the agents)
  std::chrono::seconds deadline{300};  // the whole job; then everything is stopped
};

// Returns when every worker exited 0 (OK), or with the first failure naming the process and
// its log. Every process it started is ended before it returns.
Status RunNetnsJob(const NetnsJobOptions& options);

// "198.18.0.<i+1>": the address of test host i (testhosts.sh).
std::string TestHostAddress(int host);

}  // namespace trellis::bench
