// The supervisor's decisions (restart policies, back-off, backoffLimit, stop forwarding) with
// fake processes, a fake timer and fake hooks: no real process, no real time.
#include "agent/supervisor.h"

#include <signal.h>

#include <condition_variable>
#include <deque>
#include <thread>
#include <variant>

#include <gtest/gtest.h>

namespace trellis {
namespace {

using std::chrono::milliseconds;

// What one spawned fake does.
struct Script {
  enum Kind { kExit, kBlock, kBlockIgnoringTerm, kSpawnFails } kind = kExit;
  int code = 0;
  static Script Exit(int code) { return {kExit, code}; }
  static Script Killed(int sig) { return {kExit, 128 + sig}; }
};

class FakeProcess : public Process {
 public:
  FakeProcess(Script script, std::vector<int>* signals) : script_(script), signals_(signals) {}
  pid_t pid() const override { return 4242; }
  std::optional<ExitStatus> Poll() override { return WaitFor(milliseconds(0)); }
  std::optional<ExitStatus> WaitFor(milliseconds timeout) override {
    if (script_.kind == Script::kExit) {
      int sig = script_.code > 128 ? script_.code - 128 : 0;
      return ExitStatus{script_.code, sig};
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, timeout, [&] { return end_signal_ != 0; });
    if (end_signal_ == 0) return std::nullopt;
    return ExitStatus{128 + end_signal_, end_signal_};
  }
  Status Signal(int signo) override {
    std::lock_guard<std::mutex> lock(mu_);
    signals_->push_back(signo);
    if (script_.kind == Script::kBlock || signo == SIGKILL) end_signal_ = signo;
    cv_.notify_all();
    return Status::Ok();
  }

 private:
  Script script_;
  std::vector<int>* signals_;  // owned by the spawner; written under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  int end_signal_ = 0;  // GUARDED_BY(mu_)
};

class FakeSpawner : public ProcessSpawner {
 public:
  explicit FakeSpawner(std::vector<Script> scripts) : scripts_(scripts.begin(), scripts.end()) {}
  StatusOr<std::unique_ptr<Process>> Spawn(const SpawnOptions& options) override {
    spawned.push_back(options);
    if (scripts_.empty()) return InternalError("test: no more scripted runs");
    Script s = scripts_.front();
    scripts_.pop_front();
    if (s.kind == Script::kSpawnFails) return NotFoundError("program nope: not found on PATH");
    return std::unique_ptr<Process>(new FakeProcess(s, &signals));
  }
  std::vector<SpawnOptions> spawned;
  std::vector<int> signals;

 private:
  std::deque<Script> scripts_;
};

struct ExitReport {
  ExitStatus status;
  bool will_restart;
  int restarts;
};

class FakeHooks : public SupervisorHooks {
 public:
  StatusOr<SpawnOptions> PrepareStart(int attempt) override {
    attempts.push_back(attempt);
    if (!prepare_error.ok()) return prepare_error;
    SpawnOptions o;
    o.argv = {"train", std::to_string(attempt)};
    return o;
  }
  bool MayRestart(const ExitStatus&) override { return exits.size() < may_restart_exits; }
  void OnExit(const ExitStatus& status, bool will_restart, int restarts) override {
    exits.push_back({status, will_restart, restarts});
  }
  size_t may_restart_exits = 1000;  // MayRestart is true before this many exits were reported
  std::vector<int> attempts;
  std::vector<ExitReport> exits;
  Status prepare_error;
};

class FakeTimer : public BackoffTimer {
 public:
  bool Wait(milliseconds delay) override {
    delays.push_back(delay.count());
    if (on_wait) on_wait();
    return !cancelled;
  }
  void Cancel() override { cancelled = true; }
  std::vector<int64_t> delays;
  std::function<void()> on_wait;
  bool cancelled = false;
};

RestartOptions Options(RestartPolicy policy, int limit) {
  RestartOptions o;
  o.policy = policy;
  o.backoff_limit = limit;
  o.backoff_initial = milliseconds(200);
  o.backoff_max = milliseconds(10000);
  o.stop_grace = milliseconds(50);
  return o;
}

struct Harness {
  Harness(RestartOptions options, std::vector<Script> scripts)
      : spawner(std::move(scripts)), supervisor(options, spawner, hooks, timer) {}
  FakeSpawner spawner;
  FakeHooks hooks;
  FakeTimer timer;
  Supervisor supervisor;
};

TEST(PolicyRestartsTest, FollowsEachPolicy) {
  const ExitStatus ok{0, 0}, fail{1, 0}, permanent{127, 0}, killed{137, 9};
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kNever, fail));
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kNever, killed));
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kOnFailure, ok));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kOnFailure, fail));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kOnFailure, killed));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kAlways, ok));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kAlways, fail));
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kExitCode, ok));
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kExitCode, fail));
  EXPECT_FALSE(PolicyRestarts(RestartPolicy::kExitCode, permanent));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kExitCode, killed));
  EXPECT_TRUE(PolicyRestarts(RestartPolicy::kExitCode, ExitStatus{128, 0}));
  // A configuration error (exit 78) is deterministic: no policy restarts it.
  const ExitStatus config{kExitConfigurationError, 0};
  for (auto policy : {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                      RestartPolicy::kExitCode}) {
    EXPECT_FALSE(PolicyRestarts(policy, config));
  }
}

TEST(BackoffDelayTest, DoublesUpToTheCap) {
  RestartOptions o;
  o.backoff_initial = milliseconds(200);
  o.backoff_max = milliseconds(1000);
  std::vector<int64_t> got;
  for (int i = 1; i <= 6; ++i) got.push_back(BackoffDelay(o, i).count());
  EXPECT_EQ(got, (std::vector<int64_t>{200, 400, 800, 1000, 1000, 1000}));
  o.backoff_max = milliseconds(100);  // cap below the initial delay wins
  EXPECT_EQ(BackoffDelay(o, 1).count(), 100);
  o.backoff_max = milliseconds(10000);
  EXPECT_EQ(BackoffDelay(o, 1000).count(), 10000);  // no overflow on large restart counts
}

TEST(ParseRestartPolicyFlagTest, AcceptsTheFourNamesAndExplainsOthers) {
  EXPECT_EQ(*ParseRestartPolicyFlag("Never"), RestartPolicy::kNever);
  EXPECT_EQ(*ParseRestartPolicyFlag("OnFailure"), RestartPolicy::kOnFailure);
  EXPECT_EQ(*ParseRestartPolicyFlag("Always"), RestartPolicy::kAlways);
  EXPECT_EQ(*ParseRestartPolicyFlag("ExitCode"), RestartPolicy::kExitCode);
  auto bad = ParseRestartPolicyFlag("onfailure");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("Never, OnFailure, Always or ExitCode, got 'onfailure'"),
            std::string::npos);
}

TEST(SupervisorTest, NeverRunsOnceAndKeepsTheCode) {
  Harness h(Options(RestartPolicy::kNever, 3), {Script::Exit(3)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.last.exit_code, 3);
  EXPECT_EQ(r.restarts, 0);
  EXPECT_EQ(r.AgentExitCode(), 3);
  EXPECT_EQ(h.spawner.spawned.size(), 1u);
  ASSERT_EQ(h.hooks.exits.size(), 1u);
  EXPECT_FALSE(h.hooks.exits[0].will_restart);
  EXPECT_TRUE(h.timer.delays.empty());
  EXPECT_EQ(h.supervisor.state(), Supervisor::State::kDone);
}

TEST(SupervisorTest, OnFailureRestartsWithBackoffUntilSuccess) {
  Harness h(Options(RestartPolicy::kOnFailure, 3),
            {Script::Exit(1), Script::Killed(SIGKILL), Script::Exit(0)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.last.exit_code, 0);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(h.hooks.attempts, (std::vector<int>{0, 1, 2}));  // re-registers before each start
  EXPECT_EQ(h.timer.delays, (std::vector<int64_t>{200, 400}));
  ASSERT_EQ(h.hooks.exits.size(), 3u);
  EXPECT_TRUE(h.hooks.exits[0].will_restart);
  EXPECT_EQ(h.hooks.exits[1].status.signal, SIGKILL);
  EXPECT_TRUE(h.hooks.exits[1].will_restart);
  EXPECT_FALSE(h.hooks.exits[2].will_restart);
  EXPECT_EQ(h.spawner.spawned[2].argv, (std::vector<std::string>{"train", "2"}));
}

TEST(SupervisorTest, OnFailureGivesUpAtTheBackoffLimit) {
  Harness h(Options(RestartPolicy::kOnFailure, 2), {Script::Exit(1), Script::Exit(1), Script::Exit(4)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 4);  // the program's last code
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(h.spawner.spawned.size(), 3u);
  ASSERT_EQ(h.hooks.exits.size(), 3u);
  EXPECT_FALSE(h.hooks.exits[2].will_restart);
  EXPECT_EQ(h.hooks.exits[2].restarts, 2);
}

// The job failed at its scheduler (the agent's MayRestart asks it): a restarted program could not
// join it, so the budget is not spent on restarts that fail at once.
TEST(SupervisorTest, NoRestartOnceTheHooksSayTheJobCannotTakeOne) {
  Harness h(Options(RestartPolicy::kOnFailure, 3), {Script::Exit(1), Script::Exit(4), Script::Exit(1)});
  h.hooks.may_restart_exits = 1;  // the first exit is restarted, the second is not
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 4);
  EXPECT_EQ(r.restarts, 1);
  EXPECT_EQ(h.spawner.spawned.size(), 2u);
  ASSERT_EQ(h.hooks.exits.size(), 2u);
  EXPECT_TRUE(h.hooks.exits[0].will_restart);
  EXPECT_FALSE(h.hooks.exits[1].will_restart);
}

TEST(SupervisorTest, BackoffLimitZeroMeansNoRestart) {
  Harness h(Options(RestartPolicy::kOnFailure, 0), {Script::Exit(1)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 1);
  EXPECT_EQ(h.spawner.spawned.size(), 1u);
}

TEST(SupervisorTest, AlwaysRestartsEvenOnSuccess) {
  Harness h(Options(RestartPolicy::kAlways, 2), {Script::Exit(0), Script::Exit(0), Script::Exit(0)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 0);
  EXPECT_EQ(h.spawner.spawned.size(), 3u);
  EXPECT_EQ(h.timer.delays, (std::vector<int64_t>{200, 400}));
}

TEST(SupervisorTest, ExitCodeRestartsSignalsButNotPermanentCodes) {
  Harness h(Options(RestartPolicy::kExitCode, 5), {Script::Killed(SIGKILL), Script::Killed(SIGSEGV), Script::Exit(2)});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 2);
  EXPECT_EQ(r.restarts, 2);
  EXPECT_EQ(h.spawner.spawned.size(), 3u);
}

TEST(SupervisorTest, ProgramThatCannotStartCountsAs127) {
  Harness h(Options(RestartPolicy::kExitCode, 3), {Script{Script::kSpawnFails, 0}});
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 127);
  ASSERT_EQ(h.hooks.exits.size(), 1u);
  EXPECT_FALSE(h.hooks.exits[0].will_restart);
}

TEST(SupervisorTest, RegistrationFailureEndsWithoutStarting) {
  Harness h(Options(RestartPolicy::kAlways, 3), {Script::Exit(0)});
  h.hooks.prepare_error = UnavailableError("scheduler down");
  SupervisorResult r = h.supervisor.Run();
  EXPECT_FALSE(r.error.ok());
  EXPECT_EQ(r.AgentExitCode(), 1);
  EXPECT_TRUE(h.spawner.spawned.empty());
}

// Runs the supervisor in a thread and waits (bounded) until the program runs.
SupervisorResult RunAndStop(Harness& h, int signo) {
  std::optional<SupervisorResult> result;
  std::thread t([&] { result = h.supervisor.Run(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.supervisor.state() != Supervisor::State::kRunning && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(h.supervisor.state(), Supervisor::State::kRunning);
  h.supervisor.RequestStop(signo);
  t.join();
  return *result;
}

TEST(SupervisorTest, StopForwardsTheSignalAndDoesNotRestart) {
  Harness h(Options(RestartPolicy::kAlways, 5), {Script{Script::kBlock, 0}, Script::Exit(0)});
  SupervisorResult r = RunAndStop(h, SIGTERM);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.last.signal, SIGTERM);
  EXPECT_EQ(r.AgentExitCode(), 143);
  EXPECT_EQ(h.spawner.signals, (std::vector<int>{SIGTERM}));
  EXPECT_EQ(h.spawner.spawned.size(), 1u);
  ASSERT_EQ(h.hooks.exits.size(), 1u);
  EXPECT_FALSE(h.hooks.exits[0].will_restart);
}

TEST(SupervisorTest, StopEscalatesToSigkillAfterTheGrace) {
  Harness h(Options(RestartPolicy::kOnFailure, 5), {Script{Script::kBlockIgnoringTerm, 0}});
  SupervisorResult r = RunAndStop(h, SIGINT);
  EXPECT_EQ(h.spawner.signals, (std::vector<int>{SIGINT, SIGKILL}));
  EXPECT_EQ(r.AgentExitCode(), 137);
}

TEST(SupervisorTest, StopDuringBackoffEndsWithTheLastCode) {
  Harness h(Options(RestartPolicy::kOnFailure, 5), {Script::Exit(7), Script::Exit(0)});
  h.timer.on_wait = [&] { h.supervisor.RequestStop(SIGTERM); };  // the signal lands mid back-off
  SupervisorResult r = h.supervisor.Run();
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.AgentExitCode(), 7);
  EXPECT_EQ(h.spawner.spawned.size(), 1u);
  EXPECT_TRUE(h.spawner.signals.empty());
}

// A stalled program (docs/scheduler.md#stalls): KillProgram SIGKILLs it (a stopped process ignores
// everything else) and the exit goes through the restart policy; supervision goes on.
TEST(SupervisorTest, KillProgramRestartsTheProgramUnderItsPolicy) {
  Harness h(Options(RestartPolicy::kOnFailure, 5),
            {Script{Script::kBlockIgnoringTerm, 0}, Script::Exit(0)});
  EXPECT_FALSE(h.supervisor.KillProgram()) << "nothing runs yet";
  std::optional<SupervisorResult> result;
  std::thread t([&] { result = h.supervisor.Run(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.supervisor.state() != Supervisor::State::kRunning &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_EQ(h.supervisor.state(), Supervisor::State::kRunning);
  EXPECT_TRUE(h.supervisor.KillProgram());
  t.join();
  ASSERT_TRUE(result.has_value());
  EXPECT_FALSE(result->stopped);
  EXPECT_EQ(result->restarts, 1);
  EXPECT_EQ(result->AgentExitCode(), 0);
  EXPECT_EQ(h.spawner.signals, (std::vector<int>{SIGKILL}));
  ASSERT_EQ(h.hooks.exits.size(), 2u);
  EXPECT_EQ(h.hooks.exits[0].status.exit_code, 137);
  EXPECT_TRUE(h.hooks.exits[0].will_restart);
}

// Under Never the killed program is not restarted: its exit is final (the job then fails,
// naming it).
TEST(SupervisorTest, KillProgramUnderNeverEndsSupervision) {
  Harness h(Options(RestartPolicy::kNever, 5), {Script{Script::kBlock, 0}});
  std::optional<SupervisorResult> result;
  std::thread t([&] { result = h.supervisor.Run(); });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.supervisor.state() != Supervisor::State::kRunning &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  ASSERT_TRUE(h.supervisor.KillProgram());
  t.join();
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->AgentExitCode(), 137);
  ASSERT_EQ(h.hooks.exits.size(), 1u);
  EXPECT_FALSE(h.hooks.exits[0].will_restart);
}

TEST(SupervisorTest, StopBeforeStartReportsTheSignal) {
  Harness h(Options(RestartPolicy::kOnFailure, 5), {Script::Exit(0)});
  h.supervisor.RequestStop(SIGTERM);
  SupervisorResult r = h.supervisor.Run();
  EXPECT_EQ(r.AgentExitCode(), 143);
  EXPECT_TRUE(h.spawner.spawned.empty());
}

TEST(RealBackoffTimerTest, CancelCutsTheWaitShort) {
  RealBackoffTimer timer;
  std::thread t([&] { timer.Cancel(); });
  auto start = std::chrono::steady_clock::now();
  bool finished = timer.Wait(std::chrono::seconds(30));
  t.join();
  EXPECT_FALSE(finished);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_FALSE(timer.Wait(milliseconds(1)));  // stays cancelled
}

}  // namespace
}  // namespace trellis
