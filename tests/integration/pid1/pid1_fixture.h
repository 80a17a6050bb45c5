// What the tests of the agent and the scheduler as PID 1 share: a temporary directory, a token,
// a scheduler process, the agent's environment, and looks into /proc.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "tests/integration/job_processes.h"

namespace trellis::pid1 {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct ProcInfo {
  pid_t pid = 0;
  pid_t ppid = 0;
  char state = '?';
};

inline std::optional<ProcInfo> Stat(pid_t pid) {
  const std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 4 > stat.size()) return std::nullopt;
  std::istringstream rest(stat.substr(close + 2));
  ProcInfo p;
  p.pid = pid;
  rest >> p.state >> p.ppid;
  return p;
}

inline std::vector<ProcInfo> AllProcesses() {
  std::vector<ProcInfo> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    if (auto p = Stat(pid)) out.push_back(*p);
  }
  ::closedir(d);
  return out;
}

inline std::vector<pid_t> ZombiesOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& p : AllProcesses()) {
    if (p.ppid == parent && p.state == 'Z') out.push_back(p.pid);
  }
  return out;
}

inline std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& p : AllProcesses()) {
    if (p.ppid == parent) out.push_back(p.pid);
  }
  return out;
}

// Live processes whose environment holds `var`=`value` and whose command line is `cmdline`
// (arguments separated by spaces).
inline std::vector<ProcInfo> Marked(const std::string& var, const std::string& value, const std::string& cmdline) {
  std::vector<ProcInfo> out;
  for (const auto& p : AllProcesses()) {
    if (p.state == 'Z') continue;
    const std::string dir = "/proc/" + std::to_string(p.pid);
    std::string args = ReadFile(dir + "/cmdline");
    for (char& c : args) c = c == '\0' ? ' ' : c;
    if (!args.empty() && args.back() == ' ') args.pop_back();
    if (args != cmdline) continue;
    if (ReadFile(dir + "/environ").find(var + "=" + value + '\0') == std::string::npos) continue;
    out.push_back(p);
  }
  return out;
}

template <typename F>
bool WaitUntil(F cond, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

inline bool CanUnsharePid() {
  if (::geteuid() != 0) return false;
  SpawnOptions o;
  o.argv = {"unshare", "--pid", "--fork", "--kill-child", "true"};
  o.env = CurrentEnvironment();
  o.stdout_mode = o.stderr_mode = SpawnOptions::Output::kNull;
  auto p = Subprocess::Start(o);
  if (!p.ok()) return false;
  auto s = (*p)->WaitFor(10s);
  return s && s->exit_code == 0;
}

// The process `unshare --fork` started (PID 1 of the new namespace), seen from here.
inline pid_t NamespaceInit(pid_t unshare_pid) {
  pid_t init = -1;
  WaitUntil([&] {
    auto kids = ChildrenOf(unshare_pid);
    if (kids.size() == 1) init = kids[0];
    return init > 0;
  }, 10s);
  return init;
}

class Pid1Test : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trellis-reap-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/token") << "reap-token\n";
    mark_ = "reap-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override {
    // Whatever of ours is left (the long orphan when the agent is not a namespace's PID 1).
    for (const char* cmd : {"sleep 31", "sleep 30"}) {
      for (const auto& p : Marked("REAP_MARK", mark_, cmd)) ::kill(p.pid, SIGKILL);
    }
    if (!HasFailure()) std::filesystem::remove_all(dir_);
  }

  SpawnOptions Options(std::vector<std::string> argv, const std::string& log) const {
    SpawnOptions o;
    o.argv = std::move(argv);
    o.env = CurrentEnvironment();
    o.env["REAP_MARK"] = mark_;
    o.stdout_mode = SpawnOptions::Output::kFile;
    o.stdout_path = dir_ + "/" + log;
    o.stderr_mode = SpawnOptions::Output::kStdout;
    return o;
  }

  // `argv` as PID 1 of a new PID namespace when `pid_ns`.
  std::vector<std::string> Wrapped(std::vector<std::string> argv, bool pid_ns) const {
    if (!pid_ns) return argv;
    std::vector<std::string> out = {"unshare", "--pid", "--fork", "--kill-child", "--"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  int SchedulerPort(const std::string& port_file) {
    int port = 0;
    WaitUntil([&] {
      std::ifstream in(port_file);
      return static_cast<bool>(in >> port) && port > 0;
    }, 20s);
    return port;
  }

  // A scheduler of job "reap" (one server that never comes, one worker) on a free port; its port, or 0.
  int StartScheduler() {
    const std::string bin = TRELLIS_BIN_DIR;
    auto s = Subprocess::Start(
        Options({bin + "/trellis-scheduler", "--num-servers", "1", "--num-workers", "1", "--host", "127.0.0.1",
                 "--port", "0", "--port-file", dir_ + "/port", "--token-file", dir_ + "/token", "--job-name", "reap"},
                "scheduler.log"));
    if (!s.ok()) return 0;
    scheduler_ = std::move(*s);
    return SchedulerPort(dir_ + "/port");
  }

  // trellis-agent (worker 0 of job "reap", `args` before "--", then `program`).
  SpawnOptions Agent(int port, std::vector<std::string> args, const std::vector<std::string>& program,
                     bool pid_ns = false) const {
    std::vector<std::string> argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-agent"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("--");
    argv.insert(argv.end(), program.begin(), program.end());
    SpawnOptions o = Options(Wrapped(argv, pid_ns), "agent.log");
    o.env["TRELLIS_JOB"] = "reap";
    o.env["TRELLIS_SCHEDULER"] = "127.0.0.1:" + std::to_string(port);
    o.env["TRELLIS_ROLE"] = "worker";
    o.env["TRELLIS_NUM_SERVERS"] = "1";
    o.env["TRELLIS_NUM_WORKERS"] = "1";
    o.env["TRELLIS_TOKEN_FILE"] = dir_ + "/token";
    o.env["TRELLIS_POD_NAME"] = "reap-worker-0";
    o.env.erase("TRELLIS_AGENT_METRICS_PORT");
    o.env.erase("TRELLIS_TERMINATION_LOG");
    return o;
  }

  std::unique_ptr<Subprocess> scheduler_;
  std::string dir_;
  std::string mark_;
};

}  // namespace trellis::pid1
