// The shared-memory local group: parts, the three collectives against serial arithmetic (many
// staging steps, uneven parts, n < G), threads and separate processes, a missing peer, clean-up.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/process/local_group_name.h"
#include "worker-lib/src/local_group.h"

namespace trellis {
namespace {

std::string UniqueName(const char* what) {
  static std::atomic<int> n{0};
  return std::string("lgtest-") + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(n.fetch_add(1));
}

std::vector<float> Data(int rank, int64_t n) {
  std::mt19937 rng(1000 + rank);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Runs `body(group)` on G threads, each with its own mapping of the group.
void OnThreads(int g, int64_t chunk_bytes, const std::function<void(LocalGroup&)>& body) {
  const std::string name = UniqueName("t");
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.name = name;
      o.rank = r;
      o.size = g;
      o.timeout_ms = 30000;
      o.chunk_bytes = chunk_bytes;
      auto group = OpenShmLocalGroup(o);
      ASSERT_TRUE(group.ok()) << group.status().ToString();
      body(**group);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(LocalPartTest, CoversTheTensorInOrderWithPartsWithinOne) {
  for (int g : {1, 2, 3, 4, 8}) {
    for (int64_t n : {1, 2, 3, 7, 8, 1000, 1001}) {
      int64_t next = 0, lo = n, hi = 0;
      for (int l = 0; l < g; ++l) {
        PartRange p = LocalPart(n, g, l);
        EXPECT_EQ(p.begin, next) << n << "/" << g;
        next += p.count;
        lo = std::min(lo, p.count);
        hi = std::max(hi, p.count);
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

// The backend choice, without a GPU: NCCL only with a device per local rank.
TEST(ChooseLocalBackendTest, NcclOnlyWithADevicePerRank) {
  EXPECT_TRUE(ChooseLocalBackend(1, 1, false).nccl);
  EXPECT_TRUE(ChooseLocalBackend(2, 2, false).nccl);
  EXPECT_TRUE(ChooseLocalBackend(8, 4, false).nccl);
  EXPECT_FALSE(ChooseLocalBackend(0, 1, false).nccl);
  EXPECT_FALSE(ChooseLocalBackend(0, 4, false).nccl);
  // gpusPerWorker: 2 where the process sees one GPU: two ranks on one GPU is what NCCL refuses.
  EXPECT_FALSE(ChooseLocalBackend(1, 2, false).nccl);
  EXPECT_FALSE(ChooseLocalBackend(3, 4, false).nccl);
  EXPECT_FALSE(ChooseLocalBackend(4, 4, true).nccl);
}

TEST(ChooseLocalBackendTest, SaysWhyWithDevicesAndGroupSize) {
  EXPECT_EQ(ChooseLocalBackend(1, 2, false).why,
            "this process sees 1 CUDA device for a local group of 2 (NCCL needs one device per "
            "local rank)");
  EXPECT_EQ(ChooseLocalBackend(3, 4, false).why,
            "this process sees 3 CUDA devices for a local group of 4 (NCCL needs one device per "
            "local rank)");
  EXPECT_EQ(ChooseLocalBackend(0, 2, false).why, "no CUDA device");
  EXPECT_EQ(ChooseLocalBackend(2, 2, true).why, "TRELLIS_LOCAL_BACKEND=shm");
}

struct Case {
  int g;
  int64_t n;
  int64_t chunk_bytes;
};

class ShmCollectivesTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShmCollectivesTest, MatchSerialArithmetic) {
  // Not a structured binding: clang 14 cannot capture one in a lambda.
  const int g = GetParam().g;
  const int64_t n = GetParam().n;
  const int64_t chunk = GetParam().chunk_bytes;
  // Serial reference, summed in local-rank order like the group does.
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < g; ++r) {
    auto d = Data(r, n);
    for (int64_t i = 0; i < n; ++i) sum[i] = r == 0 ? d[i] : sum[i] + d[i];
  }
  const auto root_data = Data(77, n);
  OnThreads(g, chunk, [&](LocalGroup& group) {
    const int r = group.rank();
    const PartRange mine = LocalPart(n, g, r);
    auto in = Data(r, n);
    std::vector<float> part(mine.count + 1, -7.0f);
    ASSERT_TRUE(group.ReduceScatter(in.data(), n, part.data()).ok());
    for (int64_t i = 0; i < mine.count; ++i) ASSERT_EQ(part[i], sum[mine.begin + i]) << i;
    EXPECT_EQ(part[mine.count], -7.0f);  // nothing written past the part

    // All-gather into a separate buffer, then with the part in place.
    std::vector<float> out(n, 0.0f);
    ASSERT_TRUE(group.AllGather(part.data(), n, out.data()).ok());
    EXPECT_EQ(out, sum);
    std::vector<float> inplace(n, 0.0f);
    std::copy(part.begin(), part.begin() + mine.count, inplace.begin() + mine.begin);
    ASSERT_TRUE(group.AllGather(inplace.data() + mine.begin, n, inplace.data()).ok());
    EXPECT_EQ(inplace, sum);

    const int root = g - 1;
    std::vector<float> b = r == root ? root_data : std::vector<float>(n, 0.0f);
    ASSERT_TRUE(group.Broadcast(b.data(), n, root).ok());
    EXPECT_EQ(b, root_data);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ShmCollectivesTest,
    ::testing::Values(Case{2, 1, 1 << 20}, Case{3, 2, 1 << 20}, Case{4, 7, 4096},
                      Case{2, 100'003, 4096},      // many staging steps, uneven parts
                      Case{3, 50'000, 1 << 10},    // the smallest pieces
                      Case{4, 1 << 20, 1 << 20}),  // 4 MiB through 1 MiB of staging
    [](const auto& info) {
      return "G" + std::to_string(info.param.g) + "_n" + std::to_string(info.param.n) + "_c" +
             std::to_string(info.param.chunk_bytes);
    });

TEST(ShmLocalGroupTest, SeparateProcessesReduceTheSame) {
  const std::string name = UniqueName("p");
  constexpr int kG = 3;
  constexpr int64_t kN = 30'001;
  std::vector<float> sum(kN, 0.0f);
  for (int r = 0; r < kG; ++r) {
    auto d = Data(r, kN);
    for (int64_t i = 0; i < kN; ++i) sum[i] = r == 0 ? d[i] : sum[i] + d[i];
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < kG; ++r) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the child only maps, reduces, gathers and exits
      LocalGroupOptions o;
      o.name = name;
      o.rank = r;
      o.size = kG;
      o.timeout_ms = 30000;
      o.chunk_bytes = 8192;
      auto group = OpenShmLocalGroup(o);
      if (!group.ok()) _exit(2);
      auto in = Data(r, kN);
      PartRange mine = LocalPart(kN, kG, r);
      std::vector<float> part(mine.count), out(kN);
      if (!(*group)->ReduceScatter(in.data(), kN, part.data()).ok()) _exit(3);
      if (!(*group)->AllGather(part.data(), kN, out.data()).ok()) _exit(4);
      _exit(out == sum ? 0 : 5);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  // Rank 0 unlinked the segment once everyone had attached.
  int fd = shm_open(LocalGroupShmName(name, "0").c_str(), O_RDWR, 0600);
  EXPECT_LT(fd, 0);
  if (fd >= 0) close(fd);
}

TEST(ShmLocalGroupTest, MissingPeerFailsWithinTheTimeoutAndLeavesNothing) {
  LocalGroupOptions o;
  o.name = UniqueName("missing");
  o.rank = 0;
  o.size = 2;
  o.timeout_ms = 200;
  auto group = OpenShmLocalGroup(o);
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(group.status().message().find("did one exit?"), std::string::npos)
      << group.status().ToString();
  int fd = shm_open(LocalGroupShmName(o.name, o.channel).c_str(), O_RDWR, 0600);
  EXPECT_LT(fd, 0);
  if (fd >= 0) close(fd);
}

TEST(ShmLocalGroupTest, RejectsBadOptions) {
  LocalGroupOptions o;
  o.name = UniqueName("bad");
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(OpenShmLocalGroup(o).status().code(), StatusCode::kInvalidArgument);
  o.rank = 0;
  o.name = "";
  EXPECT_EQ(OpenShmLocalGroup(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalGroupShmName("job/a b", "rs"), "/trellis-lg-job_a_b-rs");
}

TEST(ShmLocalGroupTest, GroupOfOneIsTheIdentity) {
  OnThreads(1, 4096, [](LocalGroup& group) {
    auto in = Data(0, 5000);
    std::vector<float> part(5000), out(5000);
    ASSERT_TRUE(group.ReduceScatter(in.data(), 5000, part.data()).ok());
    ASSERT_TRUE(group.AllGather(part.data(), 5000, out.data()).ok());
    EXPECT_EQ(out, in);
  });
}

}  // namespace
}  // namespace trellis
