// The agent's last words. Kubernetes turns what a container's main process writes to its
// terminationMessagePath (/dev/termination-log unless the pod says otherwise) into the
// container's state.terminated.message: the agent, PID 1 of every server and worker pod, writes
// there why it ended, in "key: value" lines that people read in `kubectl describe pod` and the
// operator reads to name the real cause on the job (operator/job_status.cc): a command that does
// not exist, a job the scheduler has already failed (recreating the pod cannot help), a worker an
// elastic job's scheduler left out for good (the job goes on without it), the
// restarts inside the pod, and the program's own last error (the line it left in
// $TRELLIS_ERROR_FILE: an uncaught Python exception, "ValueError: boom").
#pragma once

#include <string>

#include "common/config/env_names.h"
#include "common/base/status.h"

namespace trellis {

// Where the kubelet looks (the default terminationMessagePath); TRELLIS_TERMINATION_LOG
// overrides it (tests).
inline constexpr char kDefaultTerminationLog[] = "/dev/termination-log";
inline constexpr auto& kTerminationLogEnv = kEnvTerminationLog;  // the older spelling (tests, benchmarks)
// The kubelet keeps at most this many bytes of the message.
inline constexpr size_t kMaxTerminationMessage = 4096;
// The file the agent gives its program to leave its last error in (kEnvErrorFile; one line,
// e.g. "ValueError: boom"); the agent reads at most kMaxProgramError bytes of it.
inline constexpr size_t kMaxProgramError = 1024;

struct TerminationReport {
  std::string error;              // the agent's own failure (configuration, registration)
  std::string command_not_found;  // the program that could not be started (missing, not executable)
  std::string exit;               // how the program last ended: "program exited with code 3"
  int restarts = 0;               // restarts of the program inside this pod
  std::string job_failed;         // the scheduler's failure message: it has failed the job
  // An elastic job's worker the scheduler left out for good (docs/elastic.md#losing-a-worker),
  // its words: "worker 1 (pod j-worker-1) failed: exit code 137; ...". The job goes on without
  // it: no pod is made again for it.
  std::string lost;
  // Elastic servers: this pod's server rank, lost for good, taken over by another server's pod
  // (docs/elastic.md#losing-a-server): "server 1's shards are taken over by pod j-server-0 ...".
  // The job goes on: no pod is made again for it.
  std::string taken_over;
  std::string program_error;      // the program's last error, from $TRELLIS_ERROR_FILE
};

// "error: ...\ncommand-not-found: ...\nexit: ...\nrestarts: N\nprogram-error: ...\nlost: ...\n
// taken-over: ...\njob-failed: ...\n"
// (empty fields left out, line breaks inside values turned into spaces, program-error cleaned as
// CleanProgramError does), at most kMaxTerminationMessage bytes.
std::string FormatTerminationReport(const TerminationReport& report);
// The fields of FormatTerminationReport's lines; anything else in `text` is ignored (a message a
// pod template's own container wrote, or the kubelet's). program-error is cleaned again: the
// program could have written the termination log itself.
TerminationReport ParseTerminationReport(const std::string& text);

// What a program wrote as its error, made safe to show: line breaks and tabs become spaces,
// other control bytes and bytes that are not valid UTF-8 become '?', spaces at both ends go, and
// more than kMaxProgramError bytes end in "..." (never inside a UTF-8 character).
std::string CleanProgramError(const std::string& raw);

// Reads the program's error file (`path`, $TRELLIS_ERROR_FILE): at most kMaxProgramError bytes
// of it (a longer file is cut, "..."), cleaned by CleanProgramError; "" when there is none, it is
// empty, or it is not a regular file (a FIFO, a link to a device: never followed nor waited on).
std::string ReadProgramError(const std::string& path);

// Writes `text` into `path` when that file exists -- the kubelet creates it in every container;
// outside one (trellis-launch, tests) nothing is created. Errors: the file exists but cannot be
// written.
Status WriteTerminationMessage(const std::string& path, const std::string& text);

}  // namespace trellis
