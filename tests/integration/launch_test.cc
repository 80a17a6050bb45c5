// trellis-launch end to end: real scheduler, agents, test workers and servers on loopback.
// Each test uses its own job name, so "no process left" is checked by looking for that name in
// every process's environment (TRELLIS_JOB=<name>).
#include <signal.h>
#include <unistd.h>

#include <dirent.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "tests/integration/job_processes.h"
#include "tests/testing/hostile_jobs.h"

namespace trellis {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
namespace fs = std::filesystem;

struct JobOptions {
  std::string restart_policy = "OnFailure";
  int backoff_limit = 3;
  int deadline_seconds = 0;  // 0: no activeDeadlineSeconds
  std::map<std::string, std::string> worker_env;
};

std::string JobYaml(const std::string& name, const JobOptions& o) {
  std::string y =
      "apiVersion: trellis.io/v1alpha1\n"
      "kind: TrainingJob\n"
      "metadata:\n"
      "  name: " + name + "\n"
      "spec:\n"
      "  servers:\n"
      "    replicas: 2\n"
      "    command: [trellis-test-server]\n"
      "  workers:\n"
      "    replicas: 3\n"
      "    command: [trellis-test-worker]\n";
  if (!o.worker_env.empty()) {
    y += "    env:\n";
    for (const auto& [k, v] : o.worker_env) y += "      - name: " + k + "\n        value: \"" + v + "\"\n";
  }
  y += "  scheduler:\n"
       "    heartbeatIntervalSeconds: 0.2\n"
       "  runPolicy:\n"
       "    restartPolicy: " + o.restart_policy + "\n"
       "    backoffLimit: " + std::to_string(o.backoff_limit) + "\n";
  if (o.deadline_seconds > 0) y += "    activeDeadlineSeconds: " + std::to_string(o.deadline_seconds) + "\n";
  return y;
}

struct Result {
  int exit_code = -1;
  std::string output;
};

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trellis-launch-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    job_ = "it-" + std::to_string(::getpid()) + "-" + std::to_string(++counter_);
  }
  void TearDown() override {
    launcher_.reset();  // stops it (and so everything) if a test ended early
    EXPECT_TRUE(WaitNoProcessesOfJob(job_).empty()) << "processes of job " << job_ << " were left behind";
    if (!HasFailure()) fs::remove_all(dir_);
  }

  std::string WriteJob(const std::string& yaml) {
    std::string path = dir_ + "/job.yaml";
    std::ofstream(path) << yaml;
    return path;
  }

  void Start(const std::string& job_file) {
    SpawnOptions o;
    o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-launch", "--log-dir", dir_ + "/logs", job_file};
    o.env = CurrentEnvironment();
    o.stdout_mode = SpawnOptions::Output::kFile;
    o.stdout_path = dir_ + "/launch.out";
    o.stderr_mode = SpawnOptions::Output::kStdout;
    auto p = Subprocess::Start(o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    launcher_ = std::move(p).value();
  }

  Result Wait(seconds limit = seconds(120)) {
    Result r;
    auto s = launcher_->WaitFor(limit);
    r.output = Output();
    if (s) r.exit_code = s->exit_code;
    return r;
  }

  std::string Output() { return ReadFile(dir_ + "/launch.out"); }

  // Waits (bounded) until the launcher's output contains `text` `times` times.
  bool WaitForOutput(const std::string& text, int times, seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      std::string out = Output();
      int n = 0;
      for (size_t pos = out.find(text); pos != std::string::npos; pos = out.find(text, pos + 1)) ++n;
      if (n >= times) return true;
      if (launcher_->Poll()) return false;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return false;
  }

  static inline int counter_ = 0;
  std::string dir_;
  std::string job_;
  std::unique_ptr<Subprocess> launcher_;
};

TEST_F(LaunchTest, TwoServersThreeWorkersSucceed) {
  Start(WriteJob(JobYaml(job_, {})));
  Result r = Wait();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int w = 0; w < 3; ++w) {
    EXPECT_NE(r.output.find("[worker-" + std::to_string(w) + "] passed barrier b"), std::string::npos) << r.output;
  }
  EXPECT_NE(r.output.find("job " + job_ + " succeeded"), std::string::npos) << r.output;
  // Server output goes only to its log.
  EXPECT_EQ(r.output.find("test-server rank"), std::string::npos);
  EXPECT_NE(ReadFile(dir_ + "/logs/server-0.log").find("ready at 127.0.0.1:"), std::string::npos);
}

// A worker program runs with fixed malloc thresholds (docs/performance.md#malloc-settings)
// unless its job tuned malloc itself or turned them off.
TEST_F(LaunchTest, WorkersGetMallocThresholdsUnlessTheJobSetsItsOwn) {
  const std::string print_env =
      "command: [sh, -c, 'echo \"malloc mmap=$MALLOC_MMAP_THRESHOLD_ trim=$MALLOC_TRIM_THRESHOLD_\"']";
  auto run = [&](const JobOptions& o) {
    std::string y = JobYaml(job_, o);
    const std::string worker = "command: [trellis-test-worker]";
    y.replace(y.find(worker), worker.size(), print_env);
    Start(WriteJob(y));
    return Wait();
  };
  Result r = run({});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker-2] malloc mmap=33554432 trim=1073741824"), std::string::npos) << r.output;

  JobOptions own;
  own.worker_env["MALLOC_TRIM_THRESHOLD_"] = "4096";
  r = run(own);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker-0] malloc mmap= trim=4096"), std::string::npos) << r.output;

  JobOptions off;
  off.worker_env["TRELLIS_MALLOC_DEFAULTS"] = "0";
  r = run(off);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[worker-1] malloc mmap= trim=\n"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, KilledWorkerIsRestartedWithItsRankUnderOnFailure) {
  JobOptions o;
  o.worker_env["TEST_CRASH_WORKER_RANK"] = "1";
  Start(WriteJob(JobYaml(job_, o)));
  Result r = Wait();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Which pod got rank 1, and the rank of its second incarnation.
  std::smatch m;
  std::regex first(R"(\[(worker-\d)\] test-worker pod \S+ rank 1 incarnation 1)");
  ASSERT_TRUE(std::regex_search(r.output, m, first)) << r.output;
  const std::string pod = m[1];
  EXPECT_NE(r.output.find("[" + pod + "] rank 1 raising SIGKILL on purpose"), std::string::npos) << r.output;
  std::regex second("\\[" + pod + R"(\] test-worker pod \S+ rank (\d+) incarnation 2)");
  ASSERT_TRUE(std::regex_search(r.output, m, second)) << "no second incarnation of " << pod << "\n" << r.output;
  EXPECT_EQ(m[1], "1") << "the restarted worker got another rank";
  EXPECT_NE(r.output.find("[" + pod + "] done rank 1"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, KilledWorkerFailsTheJobUnderNever) {
  JobOptions o;
  o.restart_policy = "Never";
  o.worker_env["TEST_CRASH_WORKER_RANK"] = "1";
  Start(WriteJob(JobYaml(job_, o)));
  Result r = Wait();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::regex message("job " + job_ +
                     R"( failed: worker \d exited with code 137 \(SIGKILL\) after 0 restarts \(restartPolicy Never\))");
  EXPECT_TRUE(std::regex_search(r.output, message)) << r.output;
  EXPECT_NE(r.output.find("logs kept in " + dir_ + "/logs"), std::string::npos) << r.output;
}

// A SIGKILLed agent used to read as "worker 1 exited with code 137 (SIGKILL) after 0 restarts",
// as if its program had crashed: the message now says the agent died.
TEST_F(LaunchTest, AKilledAgentIsNamedAsTheAgent) {
  JobOptions o;
  o.worker_env["TEST_HOLD_SECONDS"] = "300";
  Start(WriteJob(JobYaml(job_, o)));
  ASSERT_TRUE(WaitForOutput("passed barrier a", 3, seconds(60))) << Output();
  pid_t agent = -1;
  for (pid_t pid : ProcessesOfJob(job_)) {
    const std::string comm = ReadFile("/proc/" + std::to_string(pid) + "/comm");
    const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    if (comm.rfind("trellis-agent", 0) == 0 &&
        env.find("TRELLIS_POD_NAME=" + job_ + "-worker-1" + std::string(1, '\0')) != std::string::npos) {
      agent = pid;
    }
  }
  ASSERT_GT(agent, 0) << "no agent of worker-1";
  ASSERT_EQ(::kill(agent, SIGKILL), 0);
  Result r = Wait(seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("job " + job_ + " failed: the agent of worker 1 (trellis-agent) died, killed by SIGKILL"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("after 0 restarts"), std::string::npos) << r.output;
}

TEST_F(LaunchTest, SigintStopsEveryProcess) {
  JobOptions o;
  o.worker_env["TEST_HOLD_SECONDS"] = "300";
  Start(WriteJob(JobYaml(job_, o)));
  ASSERT_TRUE(WaitForOutput("passed barrier a", 3, seconds(60))) << Output();
  EXPECT_GE(ProcessesOfJob(job_).size(), 8u);  // 5 agents + 3 held workers at least
  ASSERT_EQ(::kill(launcher_->pid(), SIGINT), 0);
  Result r = Wait(seconds(30));
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("got SIGINT; stopping every process"), std::string::npos) << r.output;
  EXPECT_TRUE(WaitNoProcessesOfJob(job_).empty());
}

TEST_F(LaunchTest, ActiveDeadlineFailsTheJob) {
  JobOptions o;
  o.deadline_seconds = 1;
  o.worker_env["TEST_HOLD_SECONDS"] = "300";
  Start(WriteJob(JobYaml(job_, o)));
  Result r = Wait(seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("job " + job_ + R"( failed: activeDeadlineSeconds \(1\) exceeded after 1\.\ds)")))
      << r.output;
}

TEST_F(LaunchTest, BadJobFileGivesTheParseErrorAndExit2) {
  std::string yaml = JobYaml(job_, {});
  yaml.replace(yaml.find("replicas: 3"), 11, "replicas: -2");
  Start(WriteJob(yaml));
  Result r = Wait(seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("replicas"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("-2"), std::string::npos) << r.output;

  Start(dir_ + "/missing.yaml");
  r = Wait(seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("missing.yaml"), std::string::npos) << r.output;
}

// Hostile job files: a message and exit 2 within seconds. Before, an alias bomb in a pod
// template made trellis-launch spin at 100% CPU and grow past 600 MB.
TEST_F(LaunchTest, HostileJobFilesAreRefusedAtOnce) {
  for (const auto& job : testing::HostileJobs()) {
    const auto start = std::chrono::steady_clock::now();
    Start(WriteJob(job.yaml));
    Result r = Wait(seconds(30));
    EXPECT_EQ(r.exit_code, 2) << job.what << ": " << r.output.substr(0, 300);
    EXPECT_NE(r.output.find(job.message), std::string::npos) << job.what << ": " << r.output.substr(0, 300);
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << job.what;
    launcher_.reset();
  }
}

}  // namespace
}  // namespace trellis
