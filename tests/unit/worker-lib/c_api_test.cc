// The C API: error reporting without a cluster, and a full round trip through every call
// against in-process parameter servers (tests/unit/worker-lib/local_cluster.h).
#include "trellis/c_api.h"

#include <stdlib.h>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <cmath>

#include <gtest/gtest.h>

#ifdef TRELLIS_C_API_HAVE_CLUSTER
#include "tests/unit/worker-lib/local_cluster.h"
#include "worker-lib/src/c_api_internal.h"
#endif

namespace {

// Clears the cluster variables for one test and restores them after.
class ScopedNoCluster {
 public:
  ScopedNoCluster() {
    for (const char* name : kNames) {
      const char* v = ::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name);
    }
  }
  ~ScopedNoCluster() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name, value->c_str(), 1);
    }
  }

 private:
  static constexpr const char* kNames[] = {"TRELLIS_SCHEDULER", "TRELLIS_RANK", "TRELLIS_TOKEN_FILE"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

TEST(CApiTest, VersionAndCodesMatchTheCppApi) {
  EXPECT_EQ(trellis_c_api_version(), TRELLIS_C_API_VERSION);
  EXPECT_EQ(TRELLIS_INVALID_ARGUMENT, static_cast<int>(trellis::StatusCode::kInvalidArgument));
  EXPECT_EQ(TRELLIS_UNAUTHENTICATED, static_cast<int>(trellis::StatusCode::kUnauthenticated));
}

TEST(CApiTest, CreateWithoutEnvironmentGivesACodeAndMessage) {
  ScopedNoCluster clean;
  trellis_worker_t* w = reinterpret_cast<trellis_worker_t*>(0x1);
  EXPECT_EQ(trellis_worker_create(nullptr, &w), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(w, nullptr);  // never left dangling
  EXPECT_NE(std::string(trellis_last_error()).find("TRELLIS_SCHEDULER"), std::string::npos)
      << trellis_last_error();
}

TEST(CApiTest, OptionsOverrideTheEnvironment) {
  ScopedNoCluster clean;
  trellis_worker_options_t options;
  trellis_worker_options_init(&options);
  EXPECT_EQ(options.rank, -1);
  options.scheduler_address = "127.0.0.1:1";  // set, so the next missing piece is reported
  options.token_file = "/nonexistent/trellis-token";
  trellis_worker_t* w = nullptr;
  const int code = trellis_worker_create(&options, &w);
  EXPECT_NE(code, TRELLIS_OK);
  EXPECT_EQ(w, nullptr);
  const std::string message = trellis_last_error();
  EXPECT_EQ(message.find("TRELLIS_SCHEDULER"), std::string::npos) << message;
  EXPECT_FALSE(message.empty());
}

TEST(CApiTest, UninitializedOptionsAreRejected) {
  trellis_worker_options_t options{};  // struct_size 0: the caller skipped _init
  trellis_worker_t* w = nullptr;
  EXPECT_EQ(trellis_worker_create(&options, &w), TRELLIS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(trellis_last_error()).find("trellis_worker_options_init"), std::string::npos);
}

TEST(CApiTest, NullArgumentsAreErrorsNotCrashes) {
  float buf[4] = {};
  trellis_handle_t* h = nullptr;
  EXPECT_EQ(trellis_worker_create(nullptr, nullptr), TRELLIS_INVALID_ARGUMENT);
  EXPECT_STREQ(trellis_last_error(), "trellis_worker_create: out is NULL");
  EXPECT_EQ(trellis_push_pull(nullptr, 0, buf, buf, 0, nullptr, nullptr, &h), TRELLIS_INVALID_ARGUMENT);
  EXPECT_STREQ(trellis_last_error(), "trellis_push_pull: worker is NULL");
  EXPECT_EQ(trellis_push(nullptr, 0, buf, 0, nullptr, nullptr, &h), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_pull(nullptr, 0, buf, 0, nullptr, nullptr, &h), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_broadcast(nullptr, 0, buf, 0, &h), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_declare_key(nullptr, 0, "k", 4), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_finish_declarations(nullptr), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_barrier(nullptr, "b"), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_report_progress(nullptr, 1, 32, 0.5), TRELLIS_INVALID_ARGUMENT);
  EXPECT_STREQ(trellis_last_error(), "trellis_report_progress: worker is NULL");
  EXPECT_EQ(trellis_set_total_steps(nullptr, 10), TRELLIS_INVALID_ARGUMENT);
  EXPECT_EQ(trellis_handle_wait(nullptr), TRELLIS_INVALID_ARGUMENT);
  EXPECT_STREQ(trellis_last_error(), "trellis_handle_wait: handle is NULL");
  EXPECT_EQ(trellis_handle_done(nullptr), -1);
  EXPECT_EQ(trellis_worker_rank(nullptr), -1);
  EXPECT_EQ(trellis_worker_size(nullptr), -1);
  EXPECT_EQ(trellis_bytes_pushed(nullptr), 0u);
  trellis_handle_free(nullptr);     // no-ops
  trellis_worker_destroy(nullptr);
}

TEST(CApiTest, LastErrorIsPerThread) {
  EXPECT_EQ(trellis_handle_wait(nullptr), TRELLIS_INVALID_ARGUMENT);
  std::string other;
  std::thread t([&] { other = trellis_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_STRNE(trellis_last_error(), "");
}

#ifdef TRELLIS_C_API_HAVE_CLUSTER

void CountDone(int code, void* user_data) {
  if (code == TRELLIS_OK) static_cast<std::atomic<int>*>(user_data)->fetch_add(1);
}

TEST(CApiClusterTest, EveryCallRoundTripsAgainstInProcessServers) {
  trellis::testing::ClusterOptions o;
  o.servers = 2;
  o.workers = 2;
  o.slice_bytes = 64;  // 16 floats per slice: keys span both servers
  trellis::testing::LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(o).ok());
  std::vector<trellis_worker_t*> w;
  for (auto& worker : cluster.workers) w.push_back(trellis::WrapWorkerForC(std::move(worker)));
  cluster.workers.clear();

  constexpr int64_t kN = 100;
  EXPECT_EQ(trellis_declare_key(w[0], 5, "empty", 0), TRELLIS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(trellis_last_error()).find("num_elements"), std::string::npos)
      << trellis_last_error();
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(trellis_worker_rank(w[i]), i);
    EXPECT_EQ(trellis_worker_size(w[i]), 2);
    EXPECT_EQ(trellis_worker_num_servers(w[i]), 2);
    ASSERT_EQ(trellis_declare_key(w[i], 7, "weights", kN), TRELLIS_OK) << trellis_last_error();
    ASSERT_EQ(trellis_declare_key(w[i], 8, nullptr, 3), TRELLIS_OK) << trellis_last_error();
    ASSERT_EQ(trellis_finish_declarations(w[i]), TRELLIS_OK) << trellis_last_error();
  }

  // Broadcast: both end with rank 0's values.
  std::vector<std::vector<float>> data(2, std::vector<float>(kN));
  for (int i = 0; i < 2; ++i)
    for (int64_t j = 0; j < kN; ++j) data[i][j] = static_cast<float>(j + 1000 * i);
  trellis_handle_t* hb[2] = {};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(trellis_broadcast(w[i], 7, data[i].data(), 0, &hb[i]), TRELLIS_OK);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(trellis_handle_wait(hb[i]), TRELLIS_OK) << trellis_last_error();
    EXPECT_EQ(trellis_handle_done(hb[i]), 1);
    trellis_handle_free(hb[i]);
  }
  EXPECT_EQ(data[1], data[0]);

  // PushPull in place with callbacks, two steps.
  std::atomic<int> callbacks{0};
  for (int step = 0; step < 2; ++step) {
    std::vector<std::vector<float>> g(2, std::vector<float>(kN));
    for (int i = 0; i < 2; ++i)
      for (int64_t j = 0; j < kN; ++j) g[i][j] = static_cast<float>(j * (i + 1) + step);
    trellis_handle_t* h[2] = {};
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(trellis_push_pull(w[i], 7, g[i].data(), g[i].data(), -1, CountDone, &callbacks, &h[i]),
                TRELLIS_OK);
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(trellis_handle_wait(h[i]), TRELLIS_OK) << trellis_last_error();
      trellis_handle_free(h[i]);
    }
    for (int i = 0; i < 2; ++i)
      for (int64_t j = 0; j < kN; ++j) ASSERT_EQ(g[i][j], static_cast<float>(3 * j + 2 * step));
  }
  EXPECT_EQ(callbacks.load(), 4);

  // Push then Pull on the small key.
  std::vector<std::vector<float>> small = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::vector<float>> got(2, std::vector<float>(3, 0));
  trellis_handle_t* hp[2] = {};
  for (int i = 0; i < 2; ++i) ASSERT_EQ(trellis_push(w[i], 8, small[i].data(), 0, nullptr, nullptr, &hp[i]), TRELLIS_OK);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(trellis_handle_wait(hp[i]), TRELLIS_OK) << trellis_last_error();
    trellis_handle_free(hp[i]);
  }
  for (int i = 0; i < 2; ++i) ASSERT_EQ(trellis_pull(w[i], 8, got[i].data(), 0, nullptr, nullptr, &hp[i]), TRELLIS_OK);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(trellis_handle_wait(hp[i]), TRELLIS_OK) << trellis_last_error();
    trellis_handle_free(hp[i]);
    EXPECT_EQ(got[i], (std::vector<float>{11, 22, 33}));
  }

  // Barrier: collective across both workers.
  // Progress: recorded per step (workers built by hand have no scheduler to send it to).
  EXPECT_EQ(trellis_set_total_steps(w[0], 100), TRELLIS_OK);
  EXPECT_EQ(trellis_report_progress(w[0], 1, 32, 0.5), TRELLIS_OK);
  EXPECT_EQ(trellis_report_progress(w[0], 2, 32, NAN), TRELLIS_OK);
  EXPECT_EQ(trellis_report_progress(w[0], -1, 32, 0.5), TRELLIS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(trellis_last_error()).find("step and samples must be >= 0"), std::string::npos)
      << trellis_last_error();
  std::thread peer([&] { EXPECT_EQ(trellis_barrier(w[1], "end"), TRELLIS_OK); });
  EXPECT_EQ(trellis_barrier(w[0], "end"), TRELLIS_OK) << trellis_last_error();
  peer.join();

  EXPECT_GT(trellis_bytes_pushed(w[0]), 2u * kN * 4);
  EXPECT_GT(trellis_bytes_pulled(w[0]), 2u * kN * 4);

  // A key nobody declared is an error code with a message, and the worker stays usable.
  float x[3] = {};
  trellis_handle_t* bad = nullptr;
  int code = trellis_push_pull(w[0], 99, x, x, 0, nullptr, nullptr, &bad);
  if (code == TRELLIS_OK) {  // reported at start or on completion: both are allowed
    code = trellis_handle_wait(bad);
    trellis_handle_free(bad);
  }
  EXPECT_NE(code, TRELLIS_OK);
  EXPECT_NE(std::string(trellis_last_error()).find("99"), std::string::npos) << trellis_last_error();
  // A key declared late (deferred init) is not usable before the next FinishDeclarations.
  EXPECT_EQ(trellis_declare_key(w[0], 9, "late", 4), TRELLIS_OK);
  code = trellis_push_pull(w[0], 9, x, x, 0, nullptr, nullptr, &bad);
  if (code == TRELLIS_OK) {
    code = trellis_handle_wait(bad);
    trellis_handle_free(bad);
  }
  EXPECT_NE(code, TRELLIS_OK);
  EXPECT_NE(std::string(trellis_last_error()).find("call FinishDeclarations again first"),
            std::string::npos)
      << trellis_last_error();

  for (auto* worker : w) trellis_worker_destroy(worker);
}

#endif  // TRELLIS_C_API_HAVE_CLUSTER

}  // namespace
