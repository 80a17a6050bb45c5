// The agent's last words. Kubernetes turns what a container's main process writes to its
// terminationMessagePath (/dev/termination-log unless the pod says otherwise) into the
// container's state.terminated.message: the agent, PID 1 of every server and worker pod, writes
// there why it ended, in "key: value" lines that people read in `kubectl describe pod` and the
// operator reads to name the real cause on the job (operator/job_status.cc): a command that does
// not exist, a job the scheduler has already failed (recreating the pod cannot help), the
// restarts inside the pod.
#pragma once

#include <string>

#include "common/status.h"

namespace trellis {

// Where the kubelet looks (the default terminationMessagePath); TRELLIS_TERMINATION_LOG
// overrides it (tests).
inline constexpr char kDefaultTerminationLog[] = "/dev/termination-log";
inline constexpr char kTerminationLogEnv[] = "TRELLIS_TERMINATION_LOG";
// The kubelet keeps at most this many bytes of the message.
inline constexpr size_t kMaxTerminationMessage = 4096;

struct TerminationReport {
  std::string error;              // the agent's own failure (configuration, registration)
  std::string command_not_found;  // the program that could not be started (missing, not executable)
  std::string exit;               // how the program last ended: "program exited with code 3"
  int restarts = 0;               // restarts of the program inside this pod
  std::string job_failed;         // the scheduler's failure message: it has failed the job
};

// "error: ...\ncommand-not-found: ...\nexit: ...\nrestarts: N\njob-failed: ...\n" (empty fields
// left out, line breaks inside values turned into spaces), at most kMaxTerminationMessage bytes.
std::string FormatTerminationReport(const TerminationReport& report);
// The fields of FormatTerminationReport's lines; anything else in `text` is ignored (a message a
// pod template's own container wrote, or the kubelet's).
TerminationReport ParseTerminationReport(const std::string& text);

// Writes `text` into `path` when that file exists -- the kubelet creates it in every container;
// outside one (trellis-launch, tests) nothing is created. Errors: the file exists but cannot be
// written.
Status WriteTerminationMessage(const std::string& path, const std::string& text);

}  // namespace trellis
