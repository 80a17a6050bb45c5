// Reaping what a process did not start (common/process/child_reaper.h): as a subreaper this test process
// adopts the orphans of its children; ReapEndedChildren and ChildReaper reap them, while a
// Subprocess's own child keeps its exit status for that Subprocess even when reaped first by
// the reaper. (Its own binary: being a subreaper would change other tests' processes.)
#include "common/process/child_reaper.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

SpawnOptions Shell(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = CurrentEnvironment();
  return o;
}

char State(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(in, line);
  const size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

// Our children that are zombies now.
int Zombies() {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string line;
    std::getline(in, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos || close + 4 > line.size()) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    n += state == 'Z' && ppid == ::getpid();
  }
  return n;
}

template <typename F>
bool WaitUntil(F cond, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

class ChildReaperTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ASSERT_TRUE(BecomeSubreaper().ok()); }
};

TEST_F(ChildReaperTest, AnOwnChildKeepsItsExitStatusWhenTheReaperWaitsForItFirst) {
  auto p = Subprocess::Start(Shell("exit 7"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return State((*p)->pid()) == 'Z'; }, 5s));
  EXPECT_EQ(ReapEndedChildren(), 0);  // it was ours: kept, not counted
  EXPECT_NE(State((*p)->pid()), 'Z');
  auto st = (*p)->WaitFor(1s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->exit_code, 7);
  EXPECT_EQ(st->signal, 0);
  // Killed by a signal, reaped first by the reaper too.
  auto q = Subprocess::Start(Shell("kill -9 $$"));
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE(WaitUntil([&] { return State((*q)->pid()) == 'Z'; }, 5s));
  ReapEndedChildren();
  auto qs = (*q)->Poll();
  ASSERT_TRUE(qs.has_value());
  EXPECT_EQ(qs->exit_code, 137);
  EXPECT_EQ(qs->signal, 9);
}

TEST_F(ChildReaperTest, OrphansOfAChildAreAdoptedAndReaped) {
  // The subshell's sleep outlives the shell: it becomes our child, then a zombie of ours.
  auto p = Subprocess::Start(Shell("(sleep 0.1 &) ; exit 0"));
  ASSERT_TRUE(p.ok());
  auto st = (*p)->WaitFor(5s);
  ASSERT_TRUE(st.has_value());
  EXPECT_EQ(st->exit_code, 0);
  int reaped = 0;
  EXPECT_TRUE(WaitUntil([&] { return (reaped += ReapEndedChildren()) >= 1; }, 5s));
  EXPECT_EQ(reaped, 1);
  EXPECT_EQ(Zombies(), 0);
}

TEST_F(ChildReaperTest, TheReaperThreadReapsOrphansAsTheyEnd) {
  ChildReaper reaper(20ms);
  for (int i = 0; i < 3; ++i) {
    auto p = Subprocess::Start(Shell("(sleep 0.05 &) ; exit 1"));
    ASSERT_TRUE(p.ok());
    auto st = (*p)->WaitFor(5s);  // the reaper may have waited for it: the status is the same
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->exit_code, 1);
  }
  EXPECT_TRUE(WaitUntil([&] { return reaper.reaped() >= 3; }, 5s)) << reaper.reaped();
  EXPECT_EQ(reaper.reaped(), 3);
  EXPECT_TRUE(WaitUntil([&] { return Zombies() == 0; }, 2s));
}

}  // namespace
}  // namespace trellis
