// Child processes: spawn into their own process group, signal the group, wait with a deadline,
// decode the exit status. Behind a small interface (Process / ProcessSpawner) so supervisors are
// tested with a fake.
//
// Every child gets PR_SET_PDEATHSIG(SIGKILL): when the parent dies, the child dies too, so a
// killed launcher or agent leaves no orphans. The death signal fires when the *thread* that
// spawned the child exits, so spawn from a long-lived thread (main).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/process/exit_codes.h"  // kExitConfigurationError, for the code that reads ExitStatus
#include "common/base/status.h"

namespace trellis {

// How a child ended.
struct ExitStatus {
  int exit_code = 0;  // the exit code, or 128+N when killed by signal N (shell convention)
  int signal = 0;     // N when killed by signal N, else 0

  bool ok() const { return exit_code == 0; }
  // "exited with code 3", "killed by SIGKILL (code 137)".
  std::string Describe() const;
  bool operator==(const ExitStatus&) const = default;
};

// Decodes a waitpid() status.
ExitStatus ExitStatusFromWait(int wait_status);
// An exit code as people read it: "0", "3", "137 (SIGKILL)" (codes 129..192 name the signal).
std::string ExitCodeWithSignal(int exit_code);
// "SIGKILL" for 9; "signal 77" when unknown.
std::string SignalName(int signo);

struct SpawnOptions {
  enum class Output {
    kInherit,  // the parent's stream
    kFile,     // appended to `*_path` (created, mode 0644)
    kPipe,     // a pipe whose read end the parent reads (Subprocess::stdout_pipe())
    kStdout,   // stderr only: the same as stdout
    kNull,     // /dev/null
  };
  std::vector<std::string> argv;  // argv[0] is looked up on the child's PATH unless it has a '/'
  // The child's whole environment (see CurrentEnvironment() in common/config/env.h).
  std::map<std::string, std::string> env;
  std::string working_dir;  // empty: the parent's
  Output stdout_mode = Output::kInherit;
  std::string stdout_path;
  Output stderr_mode = Output::kInherit;
  std::string stderr_path;
  // >= 0: the child gets this descriptor as its descriptor 3 (every other one above 2 is closed).
  int pass_fd = -1;
};

class Process {
 public:
  virtual ~Process() = default;
  virtual pid_t pid() const = 0;
  // Non-blocking: the exit status once the child has ended.
  virtual std::optional<ExitStatus> Poll() = 0;
  // Waits at most `timeout`; nullopt when still running.
  virtual std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout) = 0;
  // Sends `signo` to the child's whole process group. Safe from another thread than the waiter.
  virtual Status Signal(int signo) = 0;
};

class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;
  // Errors: argv empty, program not found / not executable, working dir missing, bad redirect.
  virtual StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) = 0;
};

// A real child. The destructor stops a still-running child (SIGTERM to the group, SIGKILL after
// the grace period) and reaps it.
class Subprocess : public Process {
 public:
  static StatusOr<std::unique_ptr<Subprocess>> Start(const SpawnOptions& options);
  ~Subprocess() override;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const override { return pid_; }
  std::optional<ExitStatus> Poll() override;
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout) override;
  Status Signal(int signo) override;

  // SIGTERM to the group, then SIGKILL after `grace`; reaps; returns how the child ended.
  ExitStatus Stop(std::chrono::milliseconds grace);

  // Readable (POLLIN) once the child has exited, for event loops; -1 when unavailable.
  int exit_fd() const { return pidfd_; }
  // Read end of the stdout pipe (kPipe), owned by this object; -1 otherwise.
  int stdout_pipe() const { return stdout_pipe_; }
  int stderr_pipe() const { return stderr_pipe_; }

  // Grace period the destructor gives a running child between SIGTERM and SIGKILL.
  void set_destructor_grace(std::chrono::milliseconds grace) { destructor_grace_ = grace; }

 private:
  Subprocess(pid_t pid, int pidfd, int stdout_pipe, int stderr_pipe);
  // Reaps if the child has ended (non-blocking).
  void TryReapLocked() REQUIRES(mu_);

  const pid_t pid_;
  const int pidfd_;  // readable once the child has exited; -1 if pidfd_open failed
  const int stdout_pipe_;
  const int stderr_pipe_;
  std::chrono::milliseconds destructor_grace_{2000};
  // Reaping and group signals take mu_, so a signal never reaches a recycled pid.
  Mutex mu_;
  std::optional<ExitStatus> exit_ GUARDED_BY(mu_);
};

// Spawns Subprocesses.
class SubprocessSpawner : public ProcessSpawner {
 public:
  StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override;
};

// Waits for every child of this process that has ended (waitpid(-1)): a Subprocess's own
// child keeps its exit status for that Subprocess (its Poll/WaitFor report it as usual); any
// other child -- an orphan inherited as PID 1 or as a subreaper (common/process/child_reaper.h) -- is
// reaped and forgotten. Returns how many such other children were reaped.
// REQUIRES: every child this process waits for was started through Subprocess (a child of
// fork/popen/system waited for by pid elsewhere could lose its status to this call).
int ReapEndedChildren();

// Finds `name` on `path_list` (colon-separated) as an executable file; names with a '/' are
// returned as they are if executable.
StatusOr<std::string> FindExecutable(const std::string& name, const std::string& path_list);
// The directory of the running executable (/proc/self/exe), e.g. "/work/main/build/bin".
StatusOr<std::string> SelfExeDir();

}  // namespace trellis
