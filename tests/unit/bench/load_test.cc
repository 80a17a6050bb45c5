// bench_pushpull --load: the competing load burns CPU only while resumed, leaves no process
// behind, and the flag means one busy process per CPU unless a count is given.
#include "bench/pushpull/cpu_load.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/pushpull/flags.h"

namespace trellis::bench {
namespace {

using namespace std::chrono_literals;

// utime + stime of a process, in clock ticks (/proc/<pid>/stat fields 14 and 15).
long CpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after "(comm) "
  std::string f;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14) utime = std::stol(f);
    if (i == 15) stime = std::stol(f);
  }
  return utime + stime;
}

TEST(BenchCpuLoad, BurnsCpuOnlyWhileResumedAndLeavesNothingBehind) {
  std::vector<pid_t> pids;
  {
    auto load = CpuLoad::Start(1);
    ASSERT_TRUE(load.ok()) << load.status().ToString();
    pids = (*load)->pids();
    ASSERT_EQ(pids.size(), 1u);
    const long stopped_before = CpuTicks(pids[0]);
    std::this_thread::sleep_for(300ms);
    EXPECT_LE(CpuTicks(pids[0]) - stopped_before, 2) << "a paused load process ran";

    ASSERT_TRUE((*load)->Resume().ok());
    const long before = CpuTicks(pids[0]);
    // On a loaded 2-core machine a busy process still gets a share: wait until it shows.
    const auto deadline = std::chrono::steady_clock::now() + 20s;
    while (CpuTicks(pids[0]) - before < 10 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
    }
    EXPECT_GE(CpuTicks(pids[0]) - before, 10) << "the resumed load process did not spin";

    ASSERT_TRUE((*load)->Pause().ok());
    const long paused = CpuTicks(pids[0]);
    std::this_thread::sleep_for(300ms);
    EXPECT_LE(CpuTicks(pids[0]) - paused, 2);
  }
  for (pid_t pid : pids) EXPECT_NE(kill(pid, 0), 0) << "load process " << pid << " outlived its CpuLoad";
}

TEST(BenchFlags, LoadMeansOneBusyProcessPerCpuUnlessCounted) {
  char prog[] = "bench_pushpull", load[] = "--load", load3[] = "--load=3", bad[] = "--load=x";
  char* none[] = {prog};
  char* plain[] = {prog, load};
  char* counted[] = {prog, load3};
  char* wrong[] = {prog, bad};
  EXPECT_EQ(ParseFlags(1, none, 2)->load_processes, 0);
  EXPECT_EQ(ParseFlags(2, plain, 2)->load_processes, 2);
  EXPECT_EQ(ParseFlags(2, counted, 2)->load_processes, 3);
  EXPECT_FALSE(ParseFlags(2, wrong, 2).ok());
}

}  // namespace
}  // namespace trellis::bench
