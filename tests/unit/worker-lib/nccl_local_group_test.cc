// The NCCL local group against the serial sums (float tolerance: NCCL sums in its own order).
// Skips without a CUDA device; G = 2 on NCCL needs two devices (NCCL refuses two ranks on one
// GPU); a group of one still runs every NCCL call. OpenLocalGroup with more ranks than devices
// must fall back to shared memory and still give the sums.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "worker-lib/cuda/nccl_local_group.h"
#include "worker-lib/cuda/twobit_cuda.h"

namespace trellis {
namespace {

std::vector<float> Data(int rank, int64_t n) {
  std::mt19937 rng(500 + rank);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

using Opener = std::function<StatusOr<std::unique_ptr<LocalGroup>>(const LocalGroupOptions&)>;

// G ranks on G threads open a group with `open` and check its kind and the three collectives.
void CheckGroup(int g, const Opener& open, const char* want_kind) {
  static std::atomic<int> id{0};
  const std::string name = "nccltest-" + std::to_string(getpid()) + "-" + std::to_string(id++);
  constexpr int64_t kN = 100'003;
  std::vector<double> sum(kN, 0.0);
  for (int r = 0; r < g; ++r) {
    auto d = Data(r, kN);
    for (int64_t i = 0; i < kN; ++i) sum[i] += d[i];
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.name = name;
      o.rank = r;
      o.size = g;
      o.timeout_ms = 60000;
      o.channel = "nccl";
      auto group = open(o);
      ASSERT_TRUE(group.ok()) << group.status().ToString();
      EXPECT_STREQ((*group)->kind(), want_kind);
      const PartRange mine = LocalPart(kN, g, r);
      auto in = Data(r, kN);
      std::vector<float> part(mine.count), out(kN);
      ASSERT_TRUE((*group)->ReduceScatter(in.data(), kN, part.data()).ok());
      for (int64_t i = 0; i < mine.count; ++i) {
        ASSERT_NEAR(part[i], sum[mine.begin + i], 1e-5) << i;
      }
      ASSERT_TRUE((*group)->AllGather(part.data(), kN, out.data()).ok());
      for (int64_t i = 0; i < kN; ++i) ASSERT_NEAR(out[i], sum[i], 1e-5) << i;
      auto root_data = Data(77, kN);
      std::vector<float> b = r == g - 1 ? root_data : std::vector<float>(kN, 0.0f);
      ASSERT_TRUE((*group)->Broadcast(b.data(), kN, g - 1).ok());
      EXPECT_EQ(b, root_data);
    });
  }
  for (auto& t : threads) t.join();
}

StatusOr<std::unique_ptr<LocalGroup>> OpenNccl(const LocalGroupOptions& options) {
  LocalGroupOptions o = options;
  // The id crosses the shm fallback (no scheduler here).
  o.exchange_key = [options](const std::string&, int, const std::string& key) {
    return ExchangeGroupKey(options, key);
  };
  return OpenNcclLocalGroup(o);
}

TEST(NcclLocalGroupTest, GroupOfOneRunsEveryCall) {
  if (CudaDeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  CheckGroup(1, OpenNccl, "nccl");
}

TEST(NcclLocalGroupTest, TwoGpusMatchTheSerialSum) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << CudaDeviceCount();
  CheckGroup(2, OpenNccl, "nccl");
}

// A pod of gpusPerWorker: 2 whose processes see one GPU (or TRELLIS_LOCAL_SIZE=2 on a one-GPU
// host): OpenLocalGroup must not put both ranks on that GPU (NCCL fails with "Duplicate GPU
// detected") but fall back to shared memory, with the same sums. With 2+ devices it is NCCL.
TEST(NcclLocalGroupTest, MoreRanksThanDevicesFallsBackToShm) {
  const int devices = CudaDeviceCount();
  if (devices < 1) GTEST_SKIP() << "no CUDA device";
  CheckGroup(
      2, [](const LocalGroupOptions& o) { return OpenLocalGroup(o, /*force_cpu=*/false); },
      devices < 2 ? "shm" : "nccl");
}

}  // namespace
}  // namespace trellis
