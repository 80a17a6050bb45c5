#include "agent/supervisor.h"

#include <signal.h>

#include <algorithm>

#include "common/base/logging.h"

namespace trellis {

bool PolicyRestarts(RestartPolicy policy, const ExitStatus& status) {
  if (status.signal == 0 && status.exit_code == kExitConfigurationError) return false;
  switch (policy) {
    case RestartPolicy::kNever: return false;
    case RestartPolicy::kOnFailure: return status.exit_code != 0;
    case RestartPolicy::kAlways: return true;
    case RestartPolicy::kExitCode: return status.exit_code >= 128;
  }
  return false;
}

std::chrono::milliseconds BackoffDelay(const RestartOptions& options, int restart) {
  int64_t delay = std::max<int64_t>(options.backoff_initial.count(), 0);
  const int64_t cap = std::max<int64_t>(options.backoff_max.count(), 0);
  for (int i = 1; i < restart && delay < cap; ++i) delay *= 2;
  return std::chrono::milliseconds(std::min(delay, cap));
}

StatusOr<RestartPolicy> ParseRestartPolicyFlag(const std::string& text) {
  // The names of job_spec.h's ToString(RestartPolicy), kept here so the supervisor stands alone.
  static const std::pair<const char*, RestartPolicy> kNames[] = {
      {"Never", RestartPolicy::kNever}, {"OnFailure", RestartPolicy::kOnFailure},
      {"Always", RestartPolicy::kAlways}, {"ExitCode", RestartPolicy::kExitCode}};
  for (const auto& [name, p] : kNames) {
    if (text == name) return p;
  }
  return InvalidArgumentError("restart policy must be Never, OnFailure, Always or ExitCode, got '" + text + "'");
}

bool RealBackoffTimer::Wait(std::chrono::milliseconds delay) {
  MutexLock lock(&mu_);
  const auto deadline = std::chrono::steady_clock::now() + delay;
  while (!cancelled_) {
    if (!cv_.WaitUntil(&mu_, deadline)) break;
  }
  return !cancelled_;
}

void RealBackoffTimer::Cancel() {
  {
    MutexLock lock(&mu_);
    cancelled_ = true;
  }
  cv_.SignalAll();
}

Supervisor::Supervisor(RestartOptions options, ProcessSpawner& spawner, SupervisorHooks& hooks,
                       BackoffTimer& timer)
    : options_(options), spawner_(spawner), hooks_(hooks), timer_(timer) {}

std::string_view Supervisor::StateName(State s) {
  switch (s) {
    case State::kIdle: return "idle";
    case State::kStarting: return "starting";
    case State::kRunning: return "running";
    case State::kBackoff: return "backoff";
    case State::kStopping: return "stopping";
    case State::kDone: return "done";
  }
  return "unknown";
}

Supervisor::State Supervisor::state() const {
  MutexLock lock(&mu_);
  return state_;
}

void Supervisor::RequestStop(int signo) {
  MutexLock lock(&mu_);
  if (stop_signal_ == 0) stop_signal_ = signo;
  if (current_ != nullptr) {
    Status s = current_->Signal(signo);
    if (!s.ok()) TLOG_WARN << "forwarding " << SignalName(signo) << ": " << s.ToString();
    state_ = State::kStopping;
  }
  timer_.Cancel();
}

bool Supervisor::KillProgram() {
  MutexLock lock(&mu_);
  if (current_ == nullptr || stop_signal_ != 0) return false;
  Status s = current_->Signal(SIGKILL);  // also ends a SIGSTOPped process
  if (!s.ok()) {
    TLOG_WARN << "killing the stalled program: " << s.ToString();
    return false;
  }
  return true;
}

SupervisorResult Supervisor::Run() {
  SupervisorResult result;
  bool ran = false;  // whether a program has run (and result.last says how it ended)
  for (int attempt = 0;; ++attempt) {
    {
      MutexLock lock(&mu_);
      if (stop_signal_ != 0) {
        // Stopped before anything ran: report it as the signal would have ended the program.
        if (!ran) result.last = ExitStatus{128 + stop_signal_, stop_signal_};
        result.stopped = true;
        state_ = State::kDone;
        return result;
      }
      state_ = State::kStarting;
    }
    auto spawn_options = hooks_.PrepareStart(attempt);
    if (!spawn_options.ok()) {
      result.error = spawn_options.status();
      MutexLock lock(&mu_);
      result.stopped = stop_signal_ != 0;
      state_ = State::kDone;
      return result;
    }

    std::unique_ptr<Process> process;
    ExitStatus status;
    Status start_error;
    {
      MutexLock lock(&mu_);
      if (stop_signal_ != 0) continue;  // the top of the loop ends it
      auto spawned = spawner_.Spawn(*spawn_options);
      if (spawned.ok()) {
        process = std::move(spawned).value();
        current_ = process.get();
        state_ = State::kRunning;
      } else {
        // A program that cannot start counts as "command not found" (127) for the policy.
        TLOG_ERROR << spawned.status().ToString();
        status = ExitStatus{127, 0};
        start_error = spawned.status();
      }
    }
    if (!start_error.ok()) hooks_.OnStartFailed(start_error, attempt);
    if (process) {
      hooks_.OnStarted(*process, attempt);
      // Once a stop was requested the program has stop_grace to end, then gets SIGKILL.
      std::optional<std::chrono::steady_clock::time_point> kill_at;
      bool killed = false;
      while (true) {
        auto now = std::chrono::steady_clock::now();
        {
          MutexLock lock(&mu_);
          if (stop_signal_ != 0 && !kill_at) kill_at = now + options_.stop_grace;
        }
        std::chrono::milliseconds wait(1000);
        if (kill_at && !killed) {
          wait = std::max(std::chrono::milliseconds(0),
                          std::chrono::duration_cast<std::chrono::milliseconds>(*kill_at - now));
        }
        if (auto s = process->WaitFor(wait)) {
          status = *s;
          break;
        }
        if (kill_at && !killed && std::chrono::steady_clock::now() >= *kill_at) {
          TLOG_WARN << "program did not stop within " << options_.stop_grace.count() << " ms; sending SIGKILL";
          (void)process->Signal(SIGKILL);
          killed = true;
        }
      }
      MutexLock lock(&mu_);
      current_ = nullptr;
    }

    result.last = status;
    ran = true;
    bool stopping;
    {
      MutexLock lock(&mu_);
      stopping = stop_signal_ != 0;
    }
    const bool wanted = !stopping && PolicyRestarts(options_.policy, status) && hooks_.MayRestart(status);
    const bool will_restart = wanted && result.restarts < options_.backoff_limit;
    if (wanted && !will_restart) {
      TLOG_WARN << "program " << status.Describe() << "; back-off limit " << options_.backoff_limit
                << " reached, not restarting";
    }
    hooks_.OnExit(status, will_restart, result.restarts);
    if (!will_restart) {
      MutexLock lock(&mu_);
      result.stopped = stopping;
      state_ = State::kDone;
      return result;
    }
    ++result.restarts;
    auto delay = BackoffDelay(options_, result.restarts);
    TLOG_INFO << "program " << status.Describe() << "; restart " << result.restarts << "/"
              << options_.backoff_limit << " in " << delay.count() << " ms";
    {
      MutexLock lock(&mu_);
      state_ = State::kBackoff;
    }
    timer_.Wait(delay);  // a stop request cancels it; the top of the loop then ends supervision
  }
}

}  // namespace trellis
