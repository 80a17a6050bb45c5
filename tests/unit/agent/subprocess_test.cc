// Real child processes: exit codes, signals, group kill, destructor reaping, parent-death kill.
#include "common/process/subprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "common/config/env.h"

namespace trellis {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = CurrentEnvironment();
  return o;
}

// True once `pid` no longer runs (gone, or a zombie waiting for someone else to reap it).
bool Gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] == 'Z' ||
         line[close + 2] == 'X';
}

bool WaitGone(pid_t pid, std::chrono::seconds limit = seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!Gone(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// Reads one line from the child's stdout pipe (bounded by the child's own behaviour).
std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

TEST(SubprocessTest, ReportsTheExitCode) {
  auto p = Subprocess::Start(Shell("exit 3"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto s = (*p)->WaitFor(seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->exit_code, 3);
  EXPECT_EQ(s->signal, 0);
  EXPECT_EQ(s->Describe(), "exited with code 3");
  EXPECT_EQ((*p)->Poll(), s);  // stays reaped
}

TEST(SubprocessTest, DecodesADeathBySignal) {
  auto p = Subprocess::Start(Shell("kill -KILL $$"));
  ASSERT_TRUE(p.ok());
  auto s = (*p)->WaitFor(seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->exit_code, 137);
  EXPECT_EQ(s->signal, SIGKILL);
  EXPECT_EQ(s->Describe(), "killed by SIGKILL (code 137)");
  EXPECT_EQ(ExitCodeWithSignal(137), "137 (SIGKILL)");
  EXPECT_EQ(ExitCodeWithSignal(143), "143 (SIGTERM)");
  EXPECT_EQ(ExitCodeWithSignal(1), "1");
}

TEST(SubprocessTest, WaitForTimesOutOnARunningChild) {
  auto p = Subprocess::Start(Shell("exec sleep 30"));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->Poll().has_value());
  EXPECT_FALSE((*p)->WaitFor(milliseconds(20)).has_value());
  ASSERT_TRUE((*p)->Signal(SIGTERM).ok());
  auto s = (*p)->WaitFor(seconds(10));
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->signal, SIGTERM);
  EXPECT_EQ(s->exit_code, 143);
  EXPECT_FALSE((*p)->Signal(SIGTERM).ok());  // never signals a reaped pid
}

TEST(SubprocessTest, SignalReachesTheWholeGroup) {
  SpawnOptions o = Shell("sleep 30 & echo $!; wait");
  o.stdout_mode = SpawnOptions::Output::kPipe;
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok());
  pid_t grandchild = std::atoi(ReadLine((*p)->stdout_pipe()).c_str());
  ASSERT_GT(grandchild, 0);
  EXPECT_EQ(::getpgid(grandchild), (*p)->pid());  // its own group, led by the child
  EXPECT_NE(::getpgid(0), (*p)->pid());
  ASSERT_TRUE((*p)->Signal(SIGKILL).ok());
  ASSERT_TRUE((*p)->WaitFor(seconds(10)).has_value());
  EXPECT_TRUE(WaitGone(grandchild));
}

TEST(SubprocessTest, DestructorStopsAndReapsARunningChild) {
  pid_t pid;
  {
    auto p = Subprocess::Start(Shell("exec sleep 30"));
    ASSERT_TRUE(p.ok());
    pid = (*p)->pid();
  }
  int ws;
  EXPECT_EQ(::waitpid(pid, &ws, WNOHANG), -1);  // already reaped
  EXPECT_EQ(errno, ECHILD);
}

TEST(SubprocessTest, StopEscalatesToSigkillWhenTermIsIgnored) {
  SpawnOptions o = Shell("trap '' TERM; echo ready; while :; do sleep 1; done");
  o.stdout_mode = SpawnOptions::Output::kPipe;
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(ReadLine((*p)->stdout_pipe()), "ready");  // the trap is in place
  ExitStatus s = (*p)->Stop(milliseconds(100));
  EXPECT_EQ(s.signal, SIGKILL);
}

TEST(SubprocessTest, ChildDiesWithItsParent) {
  // An intermediate process starts a child and dies without cleaning up: PR_SET_PDEATHSIG
  // must take the child down (no orphans when a launcher or agent is SIGKILLed).
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t middle = ::fork();
  ASSERT_GE(middle, 0);
  if (middle == 0) {
    ::close(fds[0]);
    auto p = Subprocess::Start(Shell("exec sleep 30"));
    pid_t child = p.ok() ? (*p)->pid() : -1;
    ssize_t ignored = ::write(fds[1], &child, sizeof(child));
    (void)ignored;
    std::_Exit(0);  // no destructor: the kernel must clean up
  }
  ::close(fds[1]);
  pid_t child = -1;
  ASSERT_EQ(::read(fds[0], &child, sizeof(child)), static_cast<ssize_t>(sizeof(child)));
  ::close(fds[0]);
  ASSERT_GT(child, 0);
  int ws;
  ASSERT_EQ(::waitpid(middle, &ws, 0), middle);
  EXPECT_TRUE(WaitGone(child));
}

TEST(SubprocessTest, RedirectsToFilesAndSetsEnvAndDirectory) {
  char tmpl[] = "/tmp/subprocess_redirect_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string dir = tmpl;
  SpawnOptions o = Shell("echo out:$GREETING; pwd; echo err >&2");
  o.env["GREETING"] = "hello";
  o.working_dir = dir;
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = dir + "/out.log";
  o.stderr_mode = SpawnOptions::Output::kStdout;
  auto p = Subprocess::Start(o);
  ASSERT_TRUE(p.ok());
  ASSERT_EQ((*p)->WaitFor(seconds(10))->exit_code, 0);
  std::ifstream in(dir + "/out.log");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "out:hello\n" + dir + "\nerr\n");
  std::filesystem::remove_all(dir);
}

TEST(SubprocessTest, StartErrorsAreClear) {
  SpawnOptions o;
  o.env = CurrentEnvironment();
  EXPECT_NE(Subprocess::Start(o).status().message().find("empty argv"), std::string::npos);
  o.argv = {"trellis-no-such-program"};
  auto missing = Subprocess::Start(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("trellis-no-such-program: not found on PATH"), std::string::npos);
  o.argv = {"/bin/true"};
  o.working_dir = "/nonexistent-dir";
  EXPECT_NE(Subprocess::Start(o).status().message().find("/nonexistent-dir: not a directory"),
            std::string::npos);
  o.working_dir.clear();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = "/nonexistent-dir/x.log";
  EXPECT_NE(Subprocess::Start(o).status().message().find("stdout file /nonexistent-dir/x.log"),
            std::string::npos);
}

TEST(FindExecutableTest, SearchesThePathList) {
  EXPECT_EQ(*FindExecutable("sh", "/nonexistent:/bin"), "/bin/sh");
  EXPECT_FALSE(FindExecutable("sh", "/nonexistent").ok());
  EXPECT_EQ(*FindExecutable("/bin/sh", ""), "/bin/sh");
  EXPECT_FALSE(FindExecutable("/etc/passwd", "").ok());  // not executable
  auto dir = SelfExeDir();
  ASSERT_TRUE(dir.ok());
  EXPECT_FALSE(dir->empty());
}

}  // namespace
}  // namespace trellis
