// Helpers of the multi-process tests: read a file, start a job under trellis-launch, and find
// (or wait for the end of) every process of a job. Each test uses its own job name, so "no process left" is checked by looking
// for TRELLIS_JOB=<name> in every process's environment.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/base/status.h"
#include "common/process/subprocess.h"

namespace trellis {

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Pids of processes whose environment holds TRELLIS_JOB=<job> (our own user's processes).
inline std::vector<pid_t> ProcessesOfJob(const std::string& job) {
  std::vector<pid_t> out;
  const std::string needle = "TRELLIS_JOB=" + job;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    pid_t pid = std::atoi(e->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
    size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z') continue;
    std::istringstream vars(env);
    for (std::string v; std::getline(vars, v, '\0');) {
      if (v == needle) {
        out.push_back(pid);
        break;
      }
    }
  }
  ::closedir(d);
  return out;
}

// The scheduler trellis-launch started for `job` (its command line names the job file), or -1.
inline pid_t SchedulerOf(const std::string& job) {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string proc = "/proc/" + std::to_string(pid);
    if (ReadFile(proc + "/comm").rfind("trellis-schedul", 0) == 0 &&
        ReadFile(proc + "/cmdline").find("/" + job + ".yaml") != std::string::npos) {
      found = pid;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// The pid of `role` `rank`'s program (trellis-pserver for a server, trellis-mlp for a worker;
// not its agent), or -1.
inline pid_t ProgramOf(const std::string& job, const std::string& role, int rank) {
  const std::string comm = role == "server" ? "trellis-pserver" : "trellis-mlp";
  for (pid_t pid : ProcessesOfJob(job)) {
    if (ReadFile("/proc/" + std::to_string(pid) + "/comm").rfind(comm.substr(0, 15), 0) != 0) continue;
    const std::string env = ReadFile("/proc/" + std::to_string(pid) + "/environ");
    if (env.find("TRELLIS_RANK=" + std::to_string(rank) + '\0') != std::string::npos &&
        env.find("TRELLIS_ROLE=" + role + '\0') != std::string::npos) {
      return pid;
    }
  }
  return -1;
}

// The parent of process `pid` (/proc/PID/stat), or -1.
inline pid_t ParentOf(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');  // the command may hold spaces and parentheses
  int parent = -1;
  char state = 0;
  if (close == std::string::npos || std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &parent) != 2) return -1;
  return parent;
}

// The pid of worker `rank`'s training program (trellis-mlp, a child of that worker's agent).
inline pid_t WorkerProgram(const std::string& job, int rank) { return ProgramOf(job, "worker", rank); }

// Waits (bounded) until no process of `job` remains; kills leftovers so one failure does not
// leak into the next test. Returns the pids that were still there at the deadline.
inline std::vector<pid_t> WaitNoProcessesOfJob(
    const std::string& job, std::chrono::seconds limit = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<pid_t> left;
  while (!(left = ProcessesOfJob(job)).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (pid_t p : left) ::kill(p, SIGKILL);
  return left;
}

// Starts `<bin_dir>/trellis-launch --log-dir <dir>/logs-<job> <dir>/<job>.yaml` with `yaml` as
// the job file; stdout and stderr go to <dir>/<job>.out.
inline StatusOr<std::unique_ptr<Subprocess>> StartLaunch(const std::string& bin_dir,
                                                         const std::string& dir,
                                                         const std::string& job,
                                                         const std::string& yaml) {
  const std::string file = dir + "/" + job + ".yaml";
  std::ofstream(file) << yaml;
  SpawnOptions o;
  o.argv = {bin_dir + "/trellis-launch", "--log-dir", dir + "/logs-" + job, file};
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = dir + "/" + job + ".out";
  o.stderr_mode = SpawnOptions::Output::kStdout;
  return Subprocess::Start(o);
}

// Base of the tests that run whole jobs: a fresh temporary directory per test (removed unless
// the test failed, so its logs stay for a look), and at the end a bounded wait for every process
// of each job the test named with NewJob to be gone (a leftover fails the test).
// `BIN_DIR/trellis-launch resize RUN_DIR ARGS...` (WORKERS, or --servers SERVERS), its output
// into `out_path`: its exit code (-1: it did not start, or did not end within 90 s); its output
// in *out.
inline int RunLauncherResize(const std::string& bin_dir, const std::string& run_dir,
                             const std::vector<std::string>& args, const std::string& out_path, std::string* out) {
  SpawnOptions o;
  o.argv = {bin_dir + "/trellis-launch", "resize", run_dir};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = out_path;
  o.stderr_mode = SpawnOptions::Output::kStdout;
  auto p = Subprocess::Start(o);
  if (!p.ok()) {
    *out = p.status().ToString();
    return -1;
  }
  auto st = (*p)->WaitFor(std::chrono::seconds(90));
  *out = ReadFile(out_path);
  return st ? st->exit_code : -1;
}

class LaunchedJobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trellis-job-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& job : jobs_) {
      EXPECT_TRUE(WaitNoProcessesOfJob(job).empty()) << "processes of job " << job << " left";
    }
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }
  // A job name unique to this process and test ("<prefix>-<pid>-<n>"), remembered for TearDown.
  std::string NewJob(const std::string& prefix) {
    jobs_.push_back(prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(jobs_.size()));
    return jobs_.back();
  }

  std::string dir_;
  std::vector<std::string> jobs_;
};

}  // namespace trellis
