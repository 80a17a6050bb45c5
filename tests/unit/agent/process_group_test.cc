// A multi-GPU pod's local processes as one supervised group: every copy gets its local rank,
// the group succeeds only when all do, and the first failure stops the rest.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "agent/process_group.h"
#include "common/config/env.h"
#include "common/process/local_group_name.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;

class ProcessGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("pgtest-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  SpawnOptions Shell(const std::string& script) {
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", script};
    o.env = CurrentEnvironment();
    o.env["OUT"] = dir_.string();
    o.env["TRELLIS_LOCAL_GROUP"] = "pgtest-" + std::to_string(getpid());
    return o;
  }
  // Bounded wait: the group must end within a minute or the test fails.
  ExitStatus WaitEnd(Process& p) {
    for (int i = 0; i < 60; ++i) {
      if (auto s = p.WaitFor(std::chrono::seconds(1))) return *s;
    }
    ADD_FAILURE() << "group still running after 60 s";
    return ExitStatus{-1, 0};
  }

  fs::path dir_;
};

TEST_F(ProcessGroupTest, EveryCopyGetsItsLocalRankAndTheGroupSucceeds) {
  ProcessGroupSpawner spawner(3, std::chrono::milliseconds(5000));
  SpawnOptions o = Shell(
      "echo \"$TRELLIS_LOCAL_SIZE $TRELLIS_LOCAL_GROUP $TRELLIS_METRICS_PORT\" > "
      "\"$OUT/rank-$TRELLIS_LOCAL_RANK\"");
  o.env["TRELLIS_METRICS_PORT"] = "1";  // the agent's pick, kept by local rank 0
  auto p = spawner.Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(WaitEnd(**p), ExitStatus{});
  std::set<std::string> ports;
  for (int l = 0; l < 3; ++l) {
    std::ifstream f(dir_ / ("rank-" + std::to_string(l)));
    std::string size, group, port;
    f >> size >> group >> port;
    EXPECT_EQ(size, "3");
    EXPECT_EQ(group, "pgtest-" + std::to_string(getpid()));
    ports.insert(port);
    if (l == 0) EXPECT_EQ(port, "1");
  }
  EXPECT_EQ(ports.size(), 3u);  // one /metrics port per local process
}

TEST_F(ProcessGroupTest, FirstFailureStopsTheOthersAndIsTheGroupsStatus) {
  ProcessGroupSpawner spawner(3, std::chrono::milliseconds(5000));
  // Local rank 1 fails once the others are running; they would otherwise run for 5 minutes.
  auto p = spawner.Spawn(Shell(
      "if [ \"$TRELLIS_LOCAL_RANK\" = 1 ]; then"
      "  while [ ! -e \"$OUT/up-0\" ] || [ ! -e \"$OUT/up-2\" ]; do :; done; exit 3;"
      " fi; touch \"$OUT/up-$TRELLIS_LOCAL_RANK\"; exec sleep 300"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ExitStatus s = WaitEnd(**p);
  EXPECT_EQ(s.exit_code, 3) << s.Describe();
}

TEST_F(ProcessGroupTest, SignalReachesEveryCopy) {
  ProcessGroupSpawner spawner(2, std::chrono::milliseconds(5000));
  auto p = spawner.Spawn(Shell("exec sleep 300"));
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE((*p)->Poll().has_value());
  ASSERT_TRUE((*p)->Signal(SIGTERM).ok());
  ExitStatus s = WaitEnd(**p);
  EXPECT_EQ(s.signal, SIGTERM) << s.Describe();
}

TEST_F(ProcessGroupTest, RemovesStaleSharedMemoryOfItsGroup) {
  const std::string group = "pgtest-" + std::to_string(getpid());
  const std::string name = LocalGroupShmName(group, "rs");
  int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  ProcessGroupSpawner spawner(2, std::chrono::milliseconds(5000));
  auto p = spawner.Spawn(Shell("exit 0"));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(WaitEnd(**p), ExitStatus{});
  fd = shm_open(name.c_str(), O_RDWR, 0600);
  EXPECT_LT(fd, 0);
  if (fd >= 0) close(fd);
}

}  // namespace
}  // namespace trellis
