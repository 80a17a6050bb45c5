// Priority order end to end: a worker (the real library, raw TCP) and a parameter server (the
// real TCP front-end and store), joined through a link that is held while the work is issued
// (held_link.h). A big low-priority key goes first and fills the link; small high-priority keys
// issued after it must complete before it, because they overtake its queued slices in the
// worker and their answers overtake its answers in the server. With priority off the same run
// completes in issue order, which shows the check can fail.
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "datapath/address.h"
#include "pserver/parameter_server.h"
#include "scheduler/shard_map.h"
#include "tests/integration/priority/held_link.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

constexpr KeyId kBig = 100;
constexpr int kSmallKeys = 20;
constexpr KeyId kMedium = 200;
constexpr int64_t kBigElements = 8 << 20;  // 32 MiB, 128 slices of 256 KiB: far more than a
                                           // held link absorbs (the worker's socket buffer)

struct Outcome {
  std::vector<KeyId> completion_order;
  uint64_t bulks = 0;
  std::string metrics;  // the worker's /metrics text at the end
};

Outcome IssueBehindAHeldLink(bool priority) {
  Outcome run;
  PserverOptions po;
  po.listen_host = "127.0.0.1";
  po.store.num_workers = 1;
  po.service.token = "tok";
  po.slice_bytes = 256 << 10;
  auto ps = ParameterServer::Start(po);
  EXPECT_TRUE(ps.ok()) << ps.status().ToString();
  if (!ps.ok()) return run;
  auto link = testing::HeldLink::Start((*ps)->tcp_port());
  EXPECT_TRUE(link.ok()) << link.status().ToString();
  if (!link.ok()) return run;

  WorkerSetup setup;
  setup.server_addresses = {
      DataAddress{"127.0.0.1:" + std::to_string((*ps)->port()), (*link)->port(), ""}.ToString()};
  setup.token = "tok";
  setup.transport = "tcp";
  setup.water_mark = 2;
  setup.priority_enabled = priority;
  setup.timeout_ms = 30000;
  setup.declare = [](const std::vector<v1::KeySpec>& keys) {
    return BuildShardMap(keys, 1, "roundRobin", 256 << 10);
  };
  auto worker = CreateWorker(std::move(setup));
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
  if (!worker.ok()) return run;
  Worker& w = **worker;
  EXPECT_TRUE(w.DeclareKey({.id = kBig, .name = "fc.weight", .num_elements = kBigElements}).ok());
  EXPECT_TRUE(w.DeclareKey({.id = kMedium, .name = "conv1.weight", .num_elements = 9408}).ok());
  for (int i = 0; i < kSmallKeys; ++i) {
    EXPECT_TRUE(w.DeclareKey({.id = KeyId(i), .name = "", .num_elements = 64}).ok());
  }
  EXPECT_TRUE(w.FinishDeclarations().ok());  // connects through the (open) link

  std::vector<float> big(kBigElements, 1.0f), medium(9408, 2.0f), small(kSmallKeys * 64, 3.0f);
  std::mutex mu;
  auto record = [&](KeyId k) {
    return [&, k](const Status& st) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      std::lock_guard lock(mu);
      run.completion_order.push_back(k);
    };
  };
  (*link)->Hold();
  std::vector<Handle> hs;
  // Backward pass order: the last layer's big gradient first, then earlier, smaller layers.
  hs.push_back(w.PushPull(kBig, big.data(), big.data(), -10, record(kBig)));
  hs.push_back(w.PushPull(kMedium, medium.data(), medium.data(), -1, record(kMedium)));
  for (int i = 0; i < kSmallKeys; ++i) {
    hs.push_back(w.PushPull(KeyId(i), &small[i * 64], &small[i * 64], 0, record(KeyId(i))));
  }
  (*link)->Release();
  for (auto& h : hs) EXPECT_TRUE(h.Wait().ok()) << h.Wait().ToString();
  EXPECT_EQ(big[0], 1.0f);  // W = 1: the sum is the gradient
  EXPECT_EQ(small[5], 3.0f);
  run.bulks = dynamic_cast<WorkerImpl&>(w).bulks_sent();
  run.metrics = dynamic_cast<WorkerImpl&>(w).metrics().Serialize();
  worker->reset();  // before the link and the server
  return run;
}

// The value of the first series of `name` whose labels contain `label` ("" if none).
std::string SeriesValue(const std::string& text, const std::string& name, const std::string& label) {
  size_t at = 0;
  while ((at = text.find(name + "{", at)) != std::string::npos) {
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end - at);
    at = end;
    if (line.find(label) != std::string::npos) return line.substr(line.rfind(' ') + 1);
  }
  return "";
}

size_t Position(const std::vector<KeyId>& order, KeyId k) {
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] == k) return i;
  }
  return order.size();
}

TEST(PriorityOrderTest, HighPriorityKeysIssuedLaterCompleteBeforeTheBigKey) {
  Outcome run = IssueBehindAHeldLink(/*priority=*/true);
  ASSERT_EQ(run.completion_order.size(), size_t{kSmallKeys + 2});
  const size_t big = Position(run.completion_order, kBig);
  EXPECT_EQ(big, run.completion_order.size() - 1) << "the big low-priority key finished early";
  EXPECT_LT(Position(run.completion_order, kMedium), big);
  for (int i = 0; i < kSmallKeys; ++i) EXPECT_LT(Position(run.completion_order, KeyId(i)), big);
  // The small keys waited together at the head of the queue: they went out in bulks.
  EXPECT_GT(run.bulks, 0u);
  // The scheduling metrics saw it: bulks counted, every slice timed, queues drained.
  EXPECT_NE(run.metrics.find("trellis_worker_bulks_sent_total{rank=\"0\",role=\"worker\"} " +
                             std::to_string(run.bulks)),
            std::string::npos)
      << run.metrics;
  EXPECT_NE(run.metrics.find("trellis_worker_slice_wait_seconds_count"), std::string::npos);
  EXPECT_NE(run.metrics.find("trellis_worker_slice_round_trip_seconds_count{rank=\"0\",role=\"worker\"} " +
                             std::to_string(128 + 1 + kSmallKeys)),
            std::string::npos)
      << run.metrics;
  for (const char* band : {"0", "1-9", "10-99", "100+"}) {
    EXPECT_EQ(SeriesValue(run.metrics, "trellis_worker_queue_depth_by_band_slices",
                          std::string("band=\"") + band + "\""),
              "0")
        << band << "\n" << run.metrics;
  }
}

TEST(PriorityOrderTest, WithPriorityOffKeysCompleteInIssueOrder) {
  Outcome run = IssueBehindAHeldLink(/*priority=*/false);
  ASSERT_EQ(run.completion_order.size(), size_t{kSmallKeys + 2});
  EXPECT_EQ(run.completion_order.front(), kBig);
  EXPECT_LT(Position(run.completion_order, kBig), Position(run.completion_order, kMedium));
}

}  // namespace
}  // namespace trellis
