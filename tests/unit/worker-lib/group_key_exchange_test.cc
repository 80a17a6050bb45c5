// The NCCL unique id's way from local rank 0 to the pod's other processes, without a GPU: the
// exchange hook, the scheduler behind it (a real in-process server on 127.0.0.1 with a job
// token) and the shm fallback for groups built by hand.
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scheduler/scheduler_service.h"
#include "tests/testing/test_scheduler.h"
#include "worker-lib/src/group_key_exchange.h"
#include "worker-lib/src/local_group.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// An NCCL-id-like key: 128 bytes, NULs included.
std::string IdBytes() {
  std::string s(128, '\0');
  for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<char>((i * 37) % 256);
  return s;
}

std::string UniqueName() {
  static std::atomic<int> n{0};
  return "gkx" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

// Runs ExchangeGroupKey on G threads (the G local ranks); rank 0 offers IdBytes().
std::vector<StatusOr<std::string>> RunGroup(int g,
                                            const std::function<void(LocalGroupOptions*)>& set) {
  const std::string name = UniqueName();
  std::vector<StatusOr<std::string>> got(g, InternalError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.name = name;
      o.channel = "rs";
      o.rank = r;
      o.size = g;
      o.timeout_ms = 30000;
      set(&o);
      got[r] = ExchangeGroupKey(o, r == 0 ? IdBytes() : std::string());
    });
  }
  for (auto& t : threads) t.join();
  return got;
}

TEST(GroupKeyExchangeTest, TheHookIsCalledWithTheGroupAndRank0sKey) {
  std::mutex mu;
  std::vector<std::pair<std::string, int>> calls;  // GUARDED_BY(mu)
  auto got = RunGroup(3, [&](LocalGroupOptions* o) {
    o->exchange_key = [&](const std::string& group, int rank,
                          const std::string& key) -> StatusOr<std::string> {
      std::lock_guard<std::mutex> lock(mu);
      calls.emplace_back(group, rank);
      EXPECT_EQ(key, rank == 0 ? IdBytes() : std::string());  // only rank 0 offers a key
      return IdBytes();
    };
  });
  ASSERT_EQ(calls.size(), 3u);
  for (const auto& [group, rank] : calls) EXPECT_THAT(group, ::testing::EndsWith("/rs"));
  for (auto& r : got) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, IdBytes());
  }
}

TEST(GroupKeyExchangeTest, BadKeysAreRefused) {
  LocalGroupOptions o;
  o.name = UniqueName();
  o.exchange_key = [](const std::string&, int, const std::string&) -> StatusOr<std::string> {
    return std::string(kMaxGroupKeyBytes + 1, 'x');  // a peer's key is checked, not trusted
  };
  EXPECT_EQ(ExchangeGroupKey(o, "k").status().code(), StatusCode::kInvalidArgument);
  o.rank = 1;
  EXPECT_EQ(ExchangeGroupKey(o, "").status().code(), StatusCode::kInvalidArgument);
  o.rank = 0;
  EXPECT_THAT(ExchangeGroupKey(o, std::string(kMaxGroupKeyBytes + 1, 'x')).status().message(),
              HasSubstr("1 to 1024 bytes"));
}

TEST(GroupKeyExchangeTest, ShmFallbackWithoutAHook) {
  for (auto& r : RunGroup(3, [](LocalGroupOptions*) {})) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, IdBytes());
  }
}

class SchedulerExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SchedulerConfig config;
    config.job_name = "mlp";
    auto server = testing::StartTestScheduler(config, "s3cret");
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  std::shared_ptr<SchedulerClient> Client() {
    auto c = testing::ConnectTestClient(*server_, "s3cret");
    EXPECT_TRUE(c.ok());
    return std::move(c).value();
  }
  std::unique_ptr<SchedulerServer> server_;
};

TEST_F(SchedulerExchangeTest, TheIdRoundTripsThroughTheScheduler) {
  // One client per local rank, as in a pod's processes.
  auto got = RunGroup(3, [&](LocalGroupOptions* o) {
    o->exchange_key = SchedulerGroupKeyExchange(Client(), 30s);
  });
  for (auto& r : got) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, IdBytes());
  }
}

TEST_F(SchedulerExchangeTest, AMissingRank0IsDeadlineExceeded) {
  LocalGroupOptions o;
  o.name = UniqueName();
  o.rank = 1;
  o.size = 2;
  o.exchange_key = SchedulerGroupKeyExchange(Client(), 300ms);
  auto r = ExchangeGroupKey(o, "");
  EXPECT_EQ(r.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(r.status().message(), HasSubstr("exchanging the group key"));
}

}  // namespace
}  // namespace trellis
