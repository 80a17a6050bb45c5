// trellis-scheduler as a process: port file, token, GetJob, clean exit on SIGTERM, bad flags.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "scheduler/scheduler_client.h"
#include "tests/testing/hostile_jobs.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A child process with stdout+stderr captured in a file; killed if the test leaves it running.
class Child {
 public:
  Child(std::vector<std::string> args, const fs::path& log) {
    args.insert(args.begin(), TRELLIS_SCHEDULER_BIN);
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The exit status, or -1 if it did not exit within `timeout`.
  int WaitExit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(5ms);  // polling a child's exit; no other way to wait with a bound
    }
    return -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class SchedulerMainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trellis-scheduler-main-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(SchedulerMainTest, ServesWritesThePortFileAndStopsOnSigterm) {
  std::ofstream(dir_ / "token") << "tok-123\n";
  Child child({"--num-servers", "1", "--num-workers", "2", "--host", "127.0.0.1", "--port", "0",
               "--port-file", (dir_ / "port").string(), "--token-file", (dir_ / "token").string(),
               "--job-name", "demo"},
              dir_ / "log");
  // Wait for the port file (written atomically once serving).
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!fs::exists(dir_ / "port") && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(child.WaitExit(0ms), -1) << Slurp(dir_ / "log");
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(fs::exists(dir_ / "port")) << Slurp(dir_ / "log");
  const int port = std::atoi(Slurp(dir_ / "port").c_str());
  ASSERT_GT(port, 0);
  EXPECT_THAT(Slurp(dir_ / "log"), HasSubstr("listening on 127.0.0.1:" + std::to_string(port)));

  auto client = SchedulerClient::Connect({"127.0.0.1:" + std::to_string(port), "tok-123", 5s});
  ASSERT_TRUE(client.ok());
  auto yaml = (*client)->GetJobYaml();
  ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
  EXPECT_THAT(*yaml, HasSubstr("name: demo"));
  EXPECT_THAT(*yaml, HasSubstr("replicas: 2"));
  v1::RegisterRequest reg;
  reg.set_role(v1::ROLE_WORKER);
  reg.set_pod_name("w0");
  auto r = (*client)->Register(reg);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_workers(), 2);
  auto bad = SchedulerClient::Connect({"127.0.0.1:" + std::to_string(port), "wrong", 5s});
  EXPECT_EQ((*bad)->GetJobYaml().status().code(), StatusCode::kUnauthenticated);

  // A waiting call does not keep it from stopping.
  std::thread waiter([&] { (void)(*client)->GetCluster(0, true, 20s); });
  ASSERT_EQ(kill(child.pid(), SIGTERM), 0);
  EXPECT_EQ(child.WaitExit(10s), 0) << Slurp(dir_ / "log");
  waiter.join();
}

TEST_F(SchedulerMainTest, BadFlagsExitTwoWithAMessage) {
  {
    Child child({"--num-workers", "zero"}, dir_ / "log1");
    EXPECT_EQ(child.WaitExit(10s), 2);
    EXPECT_THAT(Slurp(dir_ / "log1"), HasSubstr("--num-workers: not an integer"));
  }
  {
    Child child({"--dispatch", "random"}, dir_ / "log2");
    EXPECT_EQ(child.WaitExit(10s), 2);
    EXPECT_THAT(Slurp(dir_ / "log2"), HasSubstr("dispatch must be roundRobin, hash or balanced"));
  }
  {
    Child child({"--frobnicate", "1"}, dir_ / "log3");
    EXPECT_EQ(child.WaitExit(10s), 2);
    EXPECT_THAT(Slurp(dir_ / "log3"), HasSubstr("unknown flag --frobnicate"));
  }
  {
    Child child({"--token-file", (dir_ / "missing").string()}, dir_ / "log4");
    EXPECT_EQ(child.WaitExit(10s), 2);
    EXPECT_THAT(Slurp(dir_ / "log4"), HasSubstr("cannot open"));
  }
}

// Job files are untrusted: hostile ones get a message and exit 2 at once (before this, an alias
// bomb made the scheduler spin and grow without bound), and long strings where any string goes
// (a 32 KB image and argument) are served as they are.
TEST_F(SchedulerMainTest, HostileJobFilesAreRefusedAtOnce) {
  int i = 0;
  for (const auto& job : testing::HostileJobs()) {
    const fs::path file = dir_ / ("job" + std::to_string(i) + ".yaml");
    const fs::path log = dir_ / ("log" + std::to_string(i++));
    std::ofstream(file) << job.yaml;
    Child child({"--job-file", file.string(), "--host", "127.0.0.1", "--port", "0"}, log);
    EXPECT_EQ(child.WaitExit(20s), 2) << job.what << ": " << Slurp(log).substr(0, 300);
    EXPECT_THAT(Slurp(log), HasSubstr(job.message)) << job.what;
  }
  const std::string big(32000, 'b');
  std::ofstream(dir_ / "long.yaml") << testing::HostileHeader("long") << "  image: " << big
                                     << "\n  workers:\n    command: [w]\n    args: ['" << big << "']\n";
  Child child({"--job-file", (dir_ / "long.yaml").string(), "--host", "127.0.0.1", "--port", "0", "--port-file",
               (dir_ / "port").string()},
              dir_ / "long.log");
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!fs::exists(dir_ / "port") && std::chrono::steady_clock::now() < deadline) {
    ASSERT_EQ(child.WaitExit(0ms), -1) << Slurp(dir_ / "long.log");
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(fs::exists(dir_ / "port")) << Slurp(dir_ / "long.log");
  auto client = SchedulerClient::Connect({"127.0.0.1:" + std::to_string(std::atoi(Slurp(dir_ / "port").c_str())), "", 5s});
  ASSERT_TRUE(client.ok());
  auto yaml = (*client)->GetJobYaml();
  ASSERT_TRUE(yaml.ok()) << yaml.status().ToString();
  EXPECT_THAT(*yaml, HasSubstr(big));
}

}  // namespace
}  // namespace trellis
