// Crash recovery of a parameter server, end to end: trellis-mlp under trellis-launch (2 workers
// x 2 servers, aggregate mode, servers restarted OnFailure). Once worker 0's metrics show it past
// step kKillAfter, server 1's program (not its agent) gets SIGKILL. The agent restarts it, the
// workers reconnect and replay, and the job must succeed with a test accuracy within 1
// percentage point of an undisturbed run of the same job (in aggregate mode even the same test
// loss: the rebuilt sums are exact), with no process of it left.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"
#include "tests/testing/http_get.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;

// 131072 samples / batch 32 / 2 workers: 2048 steps per epoch; killed early in epoch 1.
constexpr int64_t kKillAfter = 600;

std::string JobYaml(const std::string& name) {
  return MlpJobYaml(name, {.server_restart = "OnFailure", .epochs = 2, .train_samples = 131072, .test_samples = 2000,
                          .server_mode = "aggregate",
                          .run_policy = "    restartPolicy: Never\n    activeDeadlineSeconds: 200\n"});
}

// One variable of a process's environment, or "".
std::string EnvOf(pid_t pid, const std::string& name) {
  const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string prefix = name + "=";
  size_t at = 0;
  while (at < env.size()) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    if (env.compare(at, prefix.size(), prefix) == 0) {
      return env.substr(at + prefix.size(), end - at - prefix.size());
    }
    at = end + 1;
  }
  return "";
}

// The pid of the job's process running `program` with TRELLIS_RANK=rank (not its agent).
std::optional<pid_t> FindProgram(const std::string& job, const std::string& program, int rank) {
  for (pid_t p : ProcessesOfJob(job)) {
    const std::string cmd = ReadFile("/proc/" + std::to_string(p) + "/cmdline");
    const std::string argv0 = cmd.substr(0, cmd.find('\0'));
    if (fs::path(argv0).filename() == program && EnvOf(p, "TRELLIS_RANK") == std::to_string(rank)) {
      return p;
    }
  }
  return std::nullopt;
}

// trellis_worker_steps_total of the process serving /metrics on `port`, or -1.
double StepsOf(int port) {
  auto r = testing::HttpGet(port, "/metrics", std::chrono::seconds(2));
  if (r.status != 200) return -1;
  const std::string name = "\ntrellis_worker_steps_total{";
  size_t at = r.body.find(name);
  if (at == std::string::npos) return -1;
  size_t space = r.body.find("} ", at);
  return std::atof(r.body.c_str() + space + 2);
}

// "RESULT: test accuracy 97.7% ..." -> 97.7, or NaN.
double AccuracyOf(const std::string& out) {
  const std::string tag = "RESULT: test accuracy ";
  size_t at = out.find(tag);
  return at == std::string::npos ? std::nan("") : std::atof(out.c_str() + at + tag.size());
}

// "RESULT: test loss 0.0037; ..." -> "0.0037", or "".
std::string TestLossOf(const std::string& out) {
  const std::string tag = "RESULT: test loss ";
  size_t at = out.find(tag);
  if (at == std::string::npos) return "";
  return out.substr(at + tag.size(), out.find(';', at) - at - tag.size());
}

class ServerKillTest : public LaunchedJobsTest {
 protected:

  // Runs one job to its end (bounded); with `kill`, SIGKILLs server 1's program once worker 0
  // is past step kKillAfter (*killed: its pid). Returns the launcher's exit code.
  int Run(bool kill, std::string* output, pid_t* killed) {
    const std::string job = NewJob("sk");
    logs_ = dir_ + "/logs-" + job;
    const std::string file = dir_ + "/" + job + ".yaml";
    std::ofstream(file) << JobYaml(job);
    SpawnOptions o;
    o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-launch", "--log-dir", logs_, file};
    o.env = CurrentEnvironment();
    o.env["PATH"] = std::string(TRELLIS_BIN_DIR) + ":" + o.env["PATH"];
    o.stdout_mode = SpawnOptions::Output::kFile;
    o.stdout_path = dir_ + "/" + job + ".out";
    o.stderr_mode = SpawnOptions::Output::kStdout;
    auto p = Subprocess::Start(o);
    if (!p.ok()) {
      *output = p.status().ToString();
      return -1;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(150);
    if (kill) {
      // Wait for progress (bounded; the launcher ending first is a failure reported below).
      int port = 0;
      while (std::chrono::steady_clock::now() < deadline && !(*p)->Poll()) {
        if (port == 0) {
          if (auto w = FindProgram(job, "trellis-mlp", 0)) {
            port = std::atoi(EnvOf(*w, "TRELLIS_METRICS_PORT").c_str());
          }
        } else if (StepsOf(port) > kKillAfter) {
          if (auto s = FindProgram(job, "trellis-pserver", 1)) {
            *killed = *s;
            ::kill(*s, SIGKILL);
            break;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    auto st = (*p)->WaitFor(std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now()));
    *output = ReadFile(o.stdout_path);
    return st ? st->exit_code : -1;
  }

  std::string logs_;  // of the last run
};

TEST_F(ServerKillTest, KilledServerIsRestartedAndTheJobFinishesAsWell) {
  std::string calm, out;
  pid_t none = 0, killed = 0;
  ASSERT_EQ(Run(false, &calm, &none), 0) << calm;
  const double want = AccuracyOf(calm);
  ASSERT_FALSE(std::isnan(want)) << calm;

  ASSERT_EQ(Run(true, &out, &killed), 0) << out;
  ASSERT_NE(killed, 0) << "the job ended before worker 0 passed step " << kKillAfter << "\n"
                       << out;
  const double got = AccuracyOf(out);
  ASSERT_FALSE(std::isnan(got)) << out;
  std::cout << "test accuracy: undisturbed " << want << "%, server 1 killed after step "
            << kKillAfter << ": " << got << "%\n";
  EXPECT_LE(std::fabs(got - want), 1.0) << "undisturbed " << want << "%, with a kill " << got
                                        << "%\n" << out;
  // Stronger: in aggregate mode the rebuilt sums are the very sums of the same pushes, so the
  // run ends exactly where the undisturbed one ends.
  EXPECT_EQ(TestLossOf(out), TestLossOf(calm)) << calm << "\n" << out;
  // The restart is visible: the agent saw the signal, the new program rebuilt from replays and
  // the workers reconnected.
  const std::string server = ReadFile(logs_ + "/server-1.log");
  EXPECT_NE(server.find("program killed by SIGKILL (code 137); restart 1/3"), std::string::npos) << server;
  EXPECT_NE(server.find("rebuilt "), std::string::npos) << server;
  const std::string worker = ReadFile(logs_ + "/worker-0.log");
  EXPECT_NE(worker.find("server 1: reconnected, replayed "), std::string::npos) << worker;
}

}  // namespace
}  // namespace trellis
