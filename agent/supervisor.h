// Supervises one program: start, wait, decide per restart policy, back off, start again.
// Knows nothing about gRPC: registration and exit reports go through SupervisorHooks, processes
// through ProcessSpawner and back-off waits through BackoffTimer, so all of it is unit-tested
// with fakes.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/base/mutex.h"
#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "common/process/subprocess.h"

namespace trellis {

struct RestartOptions {
  RestartPolicy policy = RestartPolicy::kOnFailure;
  int backoff_limit = 3;  // restarts at most; then the agent exits with the program's code
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{10000};
  // After a forwarded stop signal, the program gets this long before SIGKILL.
  std::chrono::milliseconds stop_grace{10000};
};

// Whether `policy` restarts a program that ended with `status` (the back-off limit aside).
// ExitCode follows the Kubeflow convention: 128+ codes (signals) are retryable, 1-127 permanent.
// Under every policy, exit code 78 (kExitConfigurationError) is permanent: the same start would
// fail the same way.
bool PolicyRestarts(RestartPolicy policy, const ExitStatus& status);

// Delay before restart number `restart` (1 = first restart): initial * 2^(restart-1), capped.
std::chrono::milliseconds BackoffDelay(const RestartOptions& options, int restart);

// Parses "Never", "OnFailure", "Always", "ExitCode".
StatusOr<RestartPolicy> ParseRestartPolicyFlag(const std::string& text);

class SupervisorHooks {
 public:
  virtual ~SupervisorHooks() = default;
  // Before every start (attempt 0 is the first): registers and describes the program to run.
  // An error ends supervision (the agent cannot go on without a rank).
  virtual StatusOr<SpawnOptions> PrepareStart(int attempt) = 0;
  virtual void OnStarted(const Process& process, int attempt) {}
  // The program could not be started (`error`: not found, not executable, bad working dir); the
  // attempt then counts as an exit with code 127 ("command not found") for the policy.
  virtual void OnStartFailed(const Status& error, int attempt) {}
  // After an exit the policy would restart: false when a restart is pointless (the job has
  // failed at its scheduler: a new program could not join it; or, under Always, the program
  // ended well outside the job's world: resized away).
  virtual bool MayRestart(const ExitStatus& status) { return true; }
  // After every exit. `restarts` counts the restarts done so far.
  virtual void OnExit(const ExitStatus& status, bool will_restart, int restarts) = 0;
};

// A wait that another thread can cut short.
class BackoffTimer {
 public:
  virtual ~BackoffTimer() = default;
  // Waits `delay`; false when Cancel() cut it short (or had been called before).
  virtual bool Wait(std::chrono::milliseconds delay) = 0;
  virtual void Cancel() = 0;
};

class RealBackoffTimer : public BackoffTimer {
 public:
  bool Wait(std::chrono::milliseconds delay) override EXCLUDES(mu_);
  void Cancel() override EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;  // signalled by Cancel()
  bool cancelled_ GUARDED_BY(mu_) = false;
};

struct SupervisorResult {
  ExitStatus last;          // how the program last ended (128+N when stopped by signal N)
  int restarts = 0;
  bool stopped = false;     // a stop was requested (signal forwarded)
  Status error;             // PrepareStart failed (no program could be started)
  // The agent's own exit code: the program's last code, or 1 when PrepareStart failed.
  int AgentExitCode() const { return error.ok() ? last.exit_code : 1; }
};

class Supervisor {
 public:
  enum class State { kIdle, kStarting, kRunning, kBackoff, kStopping, kDone };

  Supervisor(RestartOptions options, ProcessSpawner& spawner, SupervisorHooks& hooks,
             BackoffTimer& timer);

  // Runs the program until the policy, the back-off limit or a stop request ends it.
  // Call once, from a long-lived thread (children die with the thread that spawned them).
  SupervisorResult Run() EXCLUDES(mu_);

  // Any thread: forwards `signo` to the program's process group and stops restarting it;
  // SIGKILL follows after stop_grace if it is still running.
  void RequestStop(int signo) EXCLUDES(mu_);

  // Any thread: SIGKILLs the running program (a stalled one, docs/scheduler.md#stalls) without
  // stopping supervision: its exit then goes through the restart policy as any other. False
  // when no program runs.
  bool KillProgram() EXCLUDES(mu_);

  State state() const EXCLUDES(mu_);
  static std::string_view StateName(State s);

 private:
  const RestartOptions options_;
  ProcessSpawner& spawner_;
  SupervisorHooks& hooks_;
  BackoffTimer& timer_;

  mutable Mutex mu_;
  State state_ GUARDED_BY(mu_) = State::kIdle;
  Process* current_ GUARDED_BY(mu_) = nullptr;  // owned by Run()
  int stop_signal_ GUARDED_BY(mu_) = 0;         // non-zero once a stop was requested
};

}  // namespace trellis
