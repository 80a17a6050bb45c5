// The worker's and the server's series count what really crossed the wire: steps, bytes,
// operations, requests and completed slice-steps, for a known workload.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/unit/worker-lib/local_cluster.h"

namespace trellis {
namespace {

using testing::ClusterOptions;
using testing::LocalCluster;

// The value of one series line ("name{labels} value") in the exposition text; -1 if absent.
double Value(const MetricsRegistry& m, const std::string& series) {
  const std::string text = m.Serialize();
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::strtod(text.c_str() + at + series.size() + 2, nullptr);
}

// Gauges are sampled just after the answer that completed a handle: wait for them to settle.
bool Settles(const MetricsRegistry& m, const std::string& series, double want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Value(m, series) == want) return true;
    std::this_thread::yield();
  }
  return Value(m, series) == want;
}

class MetricsSeriesTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Transports, MetricsSeriesTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

TEST_P(MetricsSeriesTest, CountWhatCrossedTheWire) {
  ClusterOptions o;
  o.transport = GetParam();
  o.servers = 2;
  o.workers = 2;
  o.slice_bytes = 1024;  // 256 floats: key 1 has 3 slices, key 2 one
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  const int64_t n1 = 600, n2 = 100;
  ASSERT_TRUE(c.Declare({{.id = 1, .name = "a", .num_elements = n1}, {.id = 2, .name = "b", .num_elements = n2}}).ok());
  std::vector<float> g1(n1, 1.0f), g2(n2, 2.0f), o1[2] = {std::vector<float>(n1), std::vector<float>(n1)},
                                              o2[2] = {std::vector<float>(n2), std::vector<float>(n2)};
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Handle> hs;
    for (int w = 0; w < 2; ++w) {
      hs.push_back(c.workers[w]->PushPull(1, g1.data(), o1[w].data()));
      hs.push_back(c.workers[w]->PushPull(2, g2.data(), o2[w].data()));
    }
    for (auto& h : hs) ASSERT_TRUE(h.Wait().ok()) << h.Wait().ToString();
  }
  const double bytes_per_step = (n1 + n2) * 4.0;
  for (int w = 0; w < 2; ++w) {
    const MetricsRegistry& m = *c.worker_metrics[w];
    const std::string l = "{job=\"local\",rank=\"" + std::to_string(w) + "\",role=\"worker\"";
    EXPECT_EQ(Value(m, "trellis_worker_steps_total" + l + "}"), kSteps);
    EXPECT_EQ(Value(m, "trellis_worker_step_duration_seconds_count" + l + "}"), kSteps - 1);
    EXPECT_EQ(Value(m, "trellis_worker_pushed_bytes_total" + l + "}"), kSteps * bytes_per_step);
    EXPECT_EQ(Value(m, "trellis_worker_pulled_bytes_total" + l + "}"), kSteps * bytes_per_step);
    EXPECT_EQ(Value(m, "trellis_worker_slices_sent_total" + l + "}"), kSteps * 4);
    EXPECT_EQ(Value(m, "trellis_worker_operation_duration_seconds_count" + l + ",op=\"pushpull\"}"), kSteps * 2);
    EXPECT_EQ(Value(m, "trellis_worker_operation_errors_total" + l + ",op=\"pushpull\"}"), 0);
    EXPECT_TRUE(Settles(m, "trellis_worker_inflight_slices" + l + "}", 0));
    EXPECT_EQ(Value(m, "trellis_worker_queue_depth" + l + "}"), 0);
    EXPECT_TRUE(m.errors().empty());
  }
  double requests = 0, received = 0, sent = 0, slice_steps = 0, slices = 0;
  for (int s = 0; s < 2; ++s) {
    const MetricsRegistry& m = *c.server_metrics[s];
    const std::string l = "{job=\"local\",rank=\"" + std::to_string(s) + "\",role=\"server\"";
    requests += Value(m, "trellis_pserver_requests_total" + l + ",op=\"pushpull\"}");
    received += Value(m, "trellis_pserver_received_bytes_total" + l + "}");
    sent += Value(m, "trellis_pserver_sent_bytes_total" + l + "}");
    slice_steps += Value(m, "trellis_pserver_slice_steps_total" + l + "}");
    slices += Value(m, "trellis_pserver_slices" + l + "}");
    EXPECT_EQ(Value(m, "trellis_pserver_request_errors_total" + l + "}"), 0);
    EXPECT_EQ(Value(m, "trellis_pserver_waiting_pulls" + l + "}"), 0);
    EXPECT_EQ(Value(m, "trellis_pserver_aggregation_duration_seconds_count" + l + "}"),
              Value(m, "trellis_pserver_requests_total" + l + ",op=\"pushpull\"}"));
  }
  EXPECT_EQ(slices, 4);
  EXPECT_EQ(requests, kSteps * 2 * 4);  // both workers send every slice every step
  EXPECT_EQ(received, kSteps * 2 * bytes_per_step);
  EXPECT_EQ(sent, kSteps * 2 * bytes_per_step);
  EXPECT_EQ(slice_steps, kSteps * 4);
}

}  // namespace
}  // namespace trellis
