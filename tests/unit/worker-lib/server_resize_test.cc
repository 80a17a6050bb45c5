// A server resize on the workers (worker-lib/src/server_resize.h) over real servers and both
// transports: a scripted scheduler decides servers 2 -> 3 -> 1 at step boundaries, each worker
// moves the slices at the boundary (pserver/slice_handover.h), and every step's answer -- the sum
// in aggregate mode, Adam's weights in update mode -- is bit for bit the one of the same job on
// servers that never changed.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/shard_map.h"
#include "tests/unit/worker-lib/local_cluster.h"

namespace trellis {
namespace {

using testing::ClusterOptions;
using testing::CounterValue;
using testing::LocalCluster;
using testing::ServerResizeScript;

constexpr int64_t kSliceBytes = 64;  // 16 floats: keys of many slices, most of them moving
const std::vector<KeyDecl> kKeys = {{1, "fc1.weight", 40}, {2, "fc1.bias", 7}, {3, "fc2.weight", 100}};

std::vector<v1::KeySpec> Specs() {
  std::vector<v1::KeySpec> out;
  for (const auto& k : kKeys) {
    v1::KeySpec s;
    s.set_id(k.id);
    s.set_name(k.name);
    s.set_num_elements(k.num_elements);
    s.set_dtype(v1::DTYPE_FLOAT32);
    out.push_back(s);
  }
  return out;
}

struct TrainedRun {
  std::vector<std::vector<float>> answers;  // per step, every key's answer of worker 0
  std::vector<int> servers_after;          // per step, worker 0's servers in force
};

// Two workers train 12 steps on 3 started servers; with `resize`, on 2 of them first, then 3
// from step 5, then 1 from step 9; without, on 2 throughout.
TrainedRun Train(const std::string& transport, ServerMode mode, bool resize) {
  TrainedRun run;
  LocalCluster cluster;
  ServerResizeScript script(2, kSliceBytes);  // the job starts on servers 0 and 1
  ClusterOptions o;
  o.servers = 3;
  o.workers = 2;
  o.slice_bytes = kSliceBytes;
  o.transport = transport;
  o.mode = mode;
  o.optimizer.type = OptimizerType::kAdam;
  o.optimizer.learningRate = 0.01;
  o.customize = [&script](int, WorkerSetup* setup) { script.Hook(setup); };
  Status st = cluster.Start(o);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return run;
  st = cluster.Declare(kKeys);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return run;

  // Parameters as every worker holds them (aggregate mode applies the sum itself).
  std::vector<std::vector<float>> params;
  for (const auto& k : kKeys) {
    std::vector<float> p(k.num_elements);
    for (int64_t i = 0; i < k.num_elements; ++i) p[i] = 0.3f - 0.011f * static_cast<float>(i % 53);
    params.push_back(p);
  }
  if (mode == ServerMode::kUpdate) {
    for (size_t k = 0; k < kKeys.size(); ++k) {
      std::vector<float> got(params[k].size());
      Handle root = cluster.workers[0]->Broadcast(kKeys[k].id, params[k].data(), 0);
      Handle other = cluster.workers[1]->Broadcast(kKeys[k].id, got.data(), 0);
      EXPECT_TRUE(root.Wait().ok() && other.Wait().ok());
    }
  }
  for (int64_t step = 1; step <= 12; ++step) {
    // The boundaries of steps 4 and 8 move the slices.
    if (resize && step == 3) {
      EXPECT_TRUE(script.Decide(&cluster, 1, 2, 3, 5, Specs()).ok());
    }
    if (resize && step == 7) {
      EXPECT_TRUE(script.Decide(&cluster, 2, 2, 1, 9, Specs()).ok());
    }
    std::vector<float> answer;
    for (size_t k = 0; k < kKeys.size(); ++k) {
      const int64_t n = kKeys[k].num_elements;
      std::vector<std::vector<float>> grad(2, std::vector<float>(n)), out(2, std::vector<float>(n));
      for (int w = 0; w < 2; ++w) {
        for (int64_t i = 0; i < n; ++i) {
          grad[w][i] = params[k][i] * 0.5f + 0.01f * static_cast<float>((i * 3 + step * 7 + w * 5) % 11) - 0.04f;
        }
      }
      Handle a = cluster.workers[0]->PushPull(kKeys[k].id, grad[0].data(), out[0].data());
      Handle b = cluster.workers[1]->PushPull(kKeys[k].id, grad[1].data(), out[1].data());
      Status sa = a.Wait(), sb = b.Wait();
      EXPECT_TRUE(sa.ok()) << "step " << step << ": " << sa.ToString();
      EXPECT_TRUE(sb.ok()) << "step " << step << ": " << sb.ToString();
      if (!sa.ok() || !sb.ok()) return run;
      EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), n * sizeof(float)));
      if (mode == ServerMode::kUpdate) {
        params[k] = out[0];
      } else {
        for (int64_t i = 0; i < n; ++i) params[k][i] -= 0.1f * out[0][i] / 2.0f;
      }
      answer.insert(answer.end(), out[0].begin(), out[0].end());
    }
    run.answers.push_back(answer);
    for (int w = 0; w < 2; ++w) {
      auto* impl = static_cast<WorkerImpl*>(cluster.workers[w].get());
      Status b = impl->AtStepBoundary(step);
      EXPECT_TRUE(b.ok()) << "worker " << w << " at the boundary of step " << step << ": " << b.ToString();
      if (!b.ok()) return run;
    }
    run.servers_after.push_back(cluster.workers[0]->num_servers());
  }
  if (resize) {
    // The servers the shrink left hold no slice any more.
    for (int s = 1; s < 3; ++s) {
      for (const auto& k : kKeys) {
        EXPECT_EQ(cluster.servers[s]->store()->CompleteStep(k.id, 0), -1) << "server " << s;
      }
    }
    for (const auto& k : kKeys) EXPECT_EQ(cluster.servers[0]->store()->CompleteStep(k.id, 0), 12);
    // Server 2 took slices in at the grow and gave every one away at the shrink, once each.
    const double in = CounterValue(*cluster.server_metrics[2], "trellis_pserver_slices_moved_in_total");
    EXPECT_GT(in, 0);
    EXPECT_EQ(CounterValue(*cluster.server_metrics[2], "trellis_pserver_slices_moved_out_total"), in);
  }
  return run;
}

class ServerResizeTest
    : public ::testing::TestWithParam<std::tuple<std::string, ServerMode>> {};

TEST_P(ServerResizeTest, ServersTwoToThreeToOneTrainTheUndisturbedModelBitForBit) {
  const auto& [transport, mode] = GetParam();
  const TrainedRun resized = Train(transport, mode, true);
  const TrainedRun undisturbed = Train(transport, mode, false);
  ASSERT_EQ(resized.answers.size(), 12u);
  ASSERT_EQ(undisturbed.answers.size(), 12u);
  for (size_t s = 0; s < 12; ++s) {
    ASSERT_EQ(resized.answers[s].size(), undisturbed.answers[s].size());
    EXPECT_EQ(0, std::memcmp(resized.answers[s].data(), undisturbed.answers[s].data(),
                             resized.answers[s].size() * sizeof(float)))
        << "step " << s + 1 << ": the answers differ from the undisturbed job's";
  }
  // Servers in force after each boundary: 2 until the boundary of step 4, 3 until that of 8, 1.
  const std::vector<int> want = {2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 1};
  EXPECT_EQ(resized.servers_after, want);
}

INSTANTIATE_TEST_SUITE_P(
    TransportsAndModes, ServerResizeTest,
    ::testing::Combine(::testing::Values("grpc", "tcp"),
                       ::testing::Values(ServerMode::kAggregate, ServerMode::kUpdate)),
    [](const auto& info) {
      return std::get<0>(info.param) +
             (std::get<1>(info.param) == ServerMode::kUpdate ? "Update" : "Aggregate");
    });

}  // namespace
}  // namespace trellis
