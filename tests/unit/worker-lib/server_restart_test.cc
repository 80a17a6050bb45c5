// A parameter server that dies and comes back fresh (same ports, or new ones found through the
// cluster view): the workers reconnect, replay their retained pushes and go on with the right
// sums, over each transport. A server that never comes back fails the operations clearly
// within the deadline.
#include <algorithm>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/worker-lib/local_cluster.h"
#include "worker-lib/src/push_retention.h"

namespace trellis {
namespace {

using testing::ClusterOptions;
using testing::CounterValue;
using testing::LocalCluster;

class ServerRestartTest : public ::testing::TestWithParam<std::string> {
 protected:
  ClusterOptions Options() {
    ClusterOptions o;
    o.transport = GetParam();
    o.servers = 2;
    o.workers = 2;
    o.slice_bytes = 64;  // 16 floats per slice: a key spreads over both servers
    o.timeout_ms = 15000;
    return o;
  }
};
INSTANTIATE_TEST_SUITE_P(Transports, ServerRestartTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

constexpr int64_t kN = 100;

std::vector<float> Grad(int worker, int step) {
  std::vector<float> g(kN);
  for (int64_t i = 0; i < kN; ++i) g[i] = static_cast<float>(i + 100 * worker + 1000 * step);
  return g;
}

// One step on every worker: each out must be the sum of both gradients.
void Step(LocalCluster& c, int step) {
  std::vector<std::vector<float>> g = {Grad(0, step), Grad(1, step)};
  std::vector<std::vector<float>> out(2, std::vector<float>(kN, -1));
  Handle a = c.workers[0]->PushPull(1, g[0].data(), out[0].data());
  Handle b = c.workers[1]->PushPull(1, g[1].data(), out[1].data());
  ASSERT_TRUE(a.Wait().ok()) << a.Wait().ToString();
  ASSERT_TRUE(b.Wait().ok()) << b.Wait().ToString();
  for (int w = 0; w < 2; ++w) {
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(out[w][i], g[0][i] + g[1][i]) << "step " << step << " worker " << w << " i " << i;
    }
  }
}

// Waits (bounded) until server `s` received `n` pushpull slices in all.
bool WaitPushPulls(LocalCluster& c, int s, double n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (CounterValue(*c.server_metrics[s], "trellis_pserver_requests_total", "op=\"pushpull\"") >=
        n) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Killed between steps, and again while worker 0 waits in a step for worker 1's push: the
// held pull comes back with the sum of pushes made before and after the restart.
TEST_P(ServerRestartTest, RestartedServerIsRebuiltAndStepsGoOn) {
  LocalCluster c;
  ASSERT_TRUE(c.Start(Options()).ok());
  ASSERT_TRUE(c.Declare({{.id = 1, .name = "w", .num_elements = kN}}).ok());
  Step(c, 1);
  Step(c, 2);
  ASSERT_TRUE(c.RestartServer(1).ok());
  Step(c, 3);

  std::vector<float> g0 = Grad(0, 4), g1 = Grad(1, 4);
  std::vector<float> out0(kN, -1), out1(kN, -1);
  const double before =
      CounterValue(*c.server_metrics[1], "trellis_pserver_requests_total", "op=\"pushpull\"");
  Handle a = c.workers[0]->PushPull(1, g0.data(), out0.data());
  // Server 1 holds 3 of the key's 7 slices: kill it once it has worker 0's pushes.
  ASSERT_TRUE(WaitPushPulls(c, 1, before + 3));
  ASSERT_TRUE(c.RestartServer(1).ok());
  Handle b = c.workers[1]->PushPull(1, g1.data(), out1.data());
  ASSERT_TRUE(a.Wait().ok()) << a.Wait().ToString();
  ASSERT_TRUE(b.Wait().ok()) << b.Wait().ToString();
  for (int64_t i = 0; i < kN; ++i) {
    ASSERT_EQ(out0[i], g0[i] + g1[i]) << i;
    ASSERT_EQ(out1[i], g0[i] + g1[i]) << i;
  }
  Step(c, 5);
  EXPECT_GE(CounterValue(*c.worker_metrics[0], "trellis_worker_server_reconnects_total"), 2);
  EXPECT_GT(CounterValue(*c.worker_metrics[0], "trellis_worker_replayed_slices_total"), 0);
  EXPECT_GT(CounterValue(*c.server_metrics[1], "trellis_pserver_rebuilt_slices_total"), 0);
}

// The restarted server listens on other ports: the workers find it through the address
// resolver (the scheduler's cluster view in a job).
TEST_P(ServerRestartTest, RestartOnOtherPortsIsFoundThroughTheClusterView) {
  LocalCluster c;
  ASSERT_TRUE(c.Start(Options()).ok());
  ASSERT_TRUE(c.Declare({{.id = 1, .name = "w", .num_elements = kN}}).ok());
  Step(c, 1);
  ASSERT_TRUE(c.RestartServer(0, /*same_ports=*/false).ok());
  Step(c, 2);
  Step(c, 3);
}

// Never back: the operation fails within its deadline, naming the slice and the server.
TEST_P(ServerRestartTest, ServerThatNeverComesBackFailsClearly) {
  ClusterOptions o = Options();
  o.timeout_ms = 1500;
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  ASSERT_TRUE(c.Declare({{.id = 1, .name = "w", .num_elements = kN}}).ok());
  Step(c, 1);
  c.StopServer(1);
  // Each worker its own output: answers of two workers landing in one buffer would race.
  std::vector<float> g = Grad(0, 2);
  std::vector<std::vector<float>> out(2, std::vector<float>(kN));
  Handle a = c.workers[0]->PushPull(1, g.data(), out[0].data());
  Handle b = c.workers[1]->PushPull(1, g.data(), out[1].data());
  for (Handle* h : {&a, &b}) {
    Status st = h->Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(st.code() == StatusCode::kDeadlineExceeded ||
                st.code() == StatusCode::kUnavailable)
        << st.ToString();
    EXPECT_NE(st.message().find("PushPull key 1 (w) step 2: slice "), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("on server 1 (127.0.0.1:"), std::string::npos) << st.message();
  }
}

// Without retained pushes there is no recovery: the lost connection fails the operation.
TEST_P(ServerRestartTest, WithoutRetainedPushesTheLossIsAnError) {
  ClusterOptions o = Options();
  o.retain_pushes = false;
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  ASSERT_TRUE(c.Declare({{.id = 1, .name = "w", .num_elements = kN}}).ok());
  Step(c, 1);
  ASSERT_TRUE(c.RestartServer(1).ok());
  std::vector<float> g = Grad(0, 2), out(kN);
  Status st = c.workers[0]->PushPull(1, g.data(), out.data()).Wait();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("on server 1"), std::string::npos) << st.message();
}

// Retained pushes cost a copy per push; they are kept only when a dead server can come back.
TEST(RetainsPushesTest, OnlyWhenServersCanRestart) {
  JobSpec job;  // defaults: retainPushes, runPolicy OnFailure
  EXPECT_TRUE(RetainsPushes(job));
  job.runPolicy.restartPolicy = RestartPolicy::kNever;  // e.g. trellis-launch --restart-policy Never
  EXPECT_FALSE(RetainsPushes(job));
  job.servers.restartPolicy = RestartPolicy::kExitCode;  // the servers' own policy wins
  EXPECT_TRUE(RetainsPushes(job));
  job.runPolicy.restartPolicy = RestartPolicy::kAlways;
  job.servers.restartPolicy = RestartPolicy::kNever;
  EXPECT_FALSE(RetainsPushes(job));
  job.servers.restartPolicy.reset();
  job.recovery.retainPushes = false;
  EXPECT_FALSE(RetainsPushes(job));
}

}  // namespace
}  // namespace trellis
