// Real processes on loopback (datapath_fixture.h): the data path's behaviour across processes.
#include "tests/integration/datapath/datapath_fixture.h"

#include <cmath>
#include <random>
#include <thread>

namespace trellis {
namespace {

using datapath_testing::DatapathTest;
using datapath_testing::kToken;

INSTANTIATE_TEST_SUITE_P(Transports, DatapathTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

// k steps of data-parallel SGD on a linear model through 2 pserver processes equal one process
// on the concatenated batches.
TEST_P(DatapathTest, DataParallelSgdEqualsSingleProcess) {
  constexpr int kServers = 2, kWorkers = 3, kIn = 32, kBatch = 4, kSteps = 4;
  StartJob(kServers, kWorkers, 64);  // 16 floats per slice: the weight key spans 2 servers
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int n = kWorkers * kBatch * kSteps;
  std::vector<std::vector<float>> x(n, std::vector<float>(kIn));
  std::vector<float> y(n);
  for (int s = 0; s < n; ++s) {
    for (auto& v : x[s]) v = nd(rng);
    y[s] = x[s][0] - 2 * x[s][1] + 0.1f * nd(rng);
  }
  auto grad = [&](const std::vector<float>& w, int lo, int hi) {
    std::vector<float> g(kIn, 0.0f);
    for (int s = lo; s < hi; ++s) {
      float r = -y[s];
      for (int i = 0; i < kIn; ++i) r += w[i] * x[s][i];
      for (int i = 0; i < kIn; ++i) g[i] += r * x[s][i] / static_cast<float>(hi - lo);
    }
    return g;
  };
  const float lr = 0.1f;
  std::vector<float> ref(kIn, 0.25f);
  for (int step = 0; step < kSteps; ++step) {
    auto g = grad(ref, step * kWorkers * kBatch, (step + 1) * kWorkers * kBatch);
    for (int i = 0; i < kIn; ++i) ref[i] -= lr * g[i];
  }

  std::vector<std::vector<float>> final_w(kWorkers);
  std::vector<Status> results(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      auto wk = Worker::Create(Options(worker_ranks_[r]));
      if (!wk.ok()) {
        results[r] = wk.status();
        return;
      }
      Worker& worker = **wk;
      const int rank = worker.rank();
      Status st = worker.DeclareKey({.id = 0, .name = "w", .num_elements = kIn});
      if (st.ok()) st = worker.FinishDeclarations();
      std::vector<float> w(kIn, rank == 0 ? 0.25f : -9.0f);
      if (st.ok()) st = worker.Broadcast(0, w.data(), 0).Wait();
      for (int step = 0; st.ok() && step < kSteps; ++step) {
        int lo = step * kWorkers * kBatch + rank * kBatch;
        auto g = grad(w, lo, lo + kBatch);
        std::vector<float> sum(kIn);
        st = worker.PushPull(0, g.data(), sum.data(), 0).Wait();
        for (int i = 0; i < kIn; ++i) w[i] -= lr * sum[i] / kWorkers;
      }
      if (st.ok()) st = worker.Barrier("end");
      // Gradients of every step, plus the broadcast's initial values sent by the root.
      const uint64_t want = uint64_t(kSteps) * kIn * 4 + (rank == 0 ? kIn * 4 : 0);
      if (st.ok() && worker.bytes_pushed() != want) {
        st = InternalError("bytes_pushed " + std::to_string(worker.bytes_pushed()));
      }
      final_w[rank] = w;
      results[r] = st;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(results[r].ok()) << "worker " << r << ": " << results[r].ToString();
    float scale = 0;
    for (float v : ref) scale = std::max(scale, std::fabs(v));
    for (int i = 0; i < kIn; ++i) {
      ASSERT_NEAR(final_w[r][i], ref[i], 1e-5 * scale) << "worker " << r << " w[" << i << "]";
    }
  }
}

// Every worker initialises its model from its own seed; after Broadcast, before step 1, all hold
// the root's values bit for bit (key 0 from rank 0, spread over both servers; key 1 from rank 1).
TEST_P(DatapathTest, BroadcastGivesEveryWorkerTheRootsValuesWhateverItsSeed) {
  constexpr int kServers = 2, kWorkers = 3, kBig = 1000, kSmall = 7;
  StartJob(kServers, kWorkers, 256);  // 64 floats per slice: key 0 has 16 slices on 2 servers
  auto init = [](int rank, int n) {
    std::mt19937 rng(1000 + rank);  // a different seed per worker
    std::normal_distribution<float> nd;
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng);
    return v;
  };
  std::vector<std::vector<float>> big(kWorkers), small(kWorkers), after_step(kWorkers);
  auto results = RunWorkers([&](Worker& worker) {
    const int rank = worker.rank();
    Status st = worker.DeclareKey({.id = 0, .name = "big", .num_elements = kBig});
    if (st.ok()) st = worker.DeclareKey({.id = 1, .name = "small", .num_elements = kSmall});
    if (st.ok()) st = worker.FinishDeclarations();
    std::vector<float> b = init(rank, kBig), s = init(rank, kSmall);
    if (st.ok()) {
      Handle hb = worker.Broadcast(0, b.data(), 0);
      Handle hs = worker.Broadcast(1, s.data(), 1);
      st = hb.Wait();
      if (st.ok()) st = hs.Wait();
    }
    big[rank] = b;
    small[rank] = s;
    // Step 1 runs on top: the sum of equal tensors is W times the root's values.
    std::vector<float> sum(kBig);
    if (st.ok()) st = worker.PushPull(0, b.data(), sum.data()).Wait();
    after_step[rank] = sum;
    return st;
  });
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(results[r].ok()) << "worker " << r << ": " << results[r].ToString();
  }
  const std::vector<float> root_big = init(0, kBig), root_small = init(1, kSmall);
  ASSERT_NE(init(2, kBig), root_big);  // the seeds really differ
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(std::memcmp(big[r].data(), root_big.data(), kBig * 4), 0) << "worker " << r;
    EXPECT_EQ(std::memcmp(small[r].data(), root_small.data(), kSmall * 4), 0) << "worker " << r;
    EXPECT_EQ(after_step[r], after_step[0]) << "worker " << r;
  }
  for (int i = 0; i < kBig; ++i) {
    ASSERT_NEAR(after_step[0][i], kWorkers * root_big[i], 1e-5f * (1 + std::fabs(root_big[i])));
  }
}

// Update mode with Adam (servers hold weights and optimizer state): a job that stops after the
// checkpoint of step 3 and a new job (new server processes) that restores it and runs 3 more
// steps end with the very weights of one job that ran 6 steps, bit for bit.
TEST_P(DatapathTest, UpdateModeCheckpointRestoreContinueIsBitExact) {
  constexpr int kServers = 2, kWorkers = 2, kIn = 40, kSteps = 6;
  const auto ckpt = [](const char* name) { return (JobDir() / name).string(); };
  auto run = [&](const std::string& path, int steps, int64_t* restored) {
    StartJob(kServers, kWorkers, 64,
             "  serverMode: update\n  optimizer: {type: adam, learningRate: 0.05}\n"
             "  checkpoint: {path: " + path + ", intervalSteps: 3, keep: 2}\n");
    std::vector<std::vector<float>> final_w(kWorkers);
    std::vector<int64_t> from(kWorkers, -1);
    auto results = RunWorkers([&](Worker& worker) -> Status {
      const int rank = worker.rank();
      std::vector<float> w(kIn);
      for (int i = 0; i < kIn; ++i) w[i] = rank == 0 ? 0.01f * i : -5.0f;
      Status st = worker.DeclareKey({.id = 3, .name = "w", .num_elements = kIn});
      auto ck = Checkpointer::Create(worker, {{"w", w.data(), kIn, 3}});
      if (!ck.ok()) st = ck.status();
      if (st.ok()) st = worker.FinishDeclarations();
      auto at = st.ok() ? (*ck)->Restore() : StatusOr<int64_t>(st);
      if (!at.ok()) return at.status();
      from[rank] = *at;
      for (int64_t step = *at + 1; st.ok() && step <= *at + steps; ++step) {
        std::vector<float> g(kIn);  // gradient of sum_i (w_i - t_i)^2 / 2, t depends on the step
        for (int i = 0; i < kIn; ++i) {
          g[i] = w[i] - std::sin(0.1f * i + step + rank);
        }
        st = worker.PushPull(3, g.data(), w.data()).Wait();
        if (st.ok() && (*ck)->Due(step)) st = (*ck)->Save(step);
      }
      final_w[rank] = w;
      return st;
    });
    StopJob();
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_TRUE(results[r].ok()) << "worker " << r << ": " << results[r].ToString();
      EXPECT_EQ(from[r], from[0]);
    }
    *restored = from[0];
    EXPECT_EQ(final_w[1], final_w[0]);
    return final_w[0];
  };
  int64_t restored = -1;
  const std::vector<float> whole = run(ckpt("whole"), kSteps, &restored);
  EXPECT_EQ(restored, 0);
  run(ckpt("split"), kSteps / 2, &restored);
  EXPECT_EQ(restored, 0);
  EXPECT_TRUE(std::filesystem::exists(ckpt("split") + "/server-0-000000000003.ckpt"));
  EXPECT_TRUE(std::filesystem::exists(ckpt("split") + "/server-1-000000000003.ckpt"));
  EXPECT_TRUE(std::filesystem::exists(ckpt("split") + "/model-000000000003.ckpt"));
  const std::vector<float> resumed = run(ckpt("split"), kSteps / 2, &restored);
  EXPECT_EQ(restored, kSteps / 2);
  ASSERT_EQ(resumed.size(), whole.size());
  EXPECT_EQ(std::memcmp(resumed.data(), whole.data(), whole.size() * sizeof(float)), 0);
  // A checkpoint really restored state: a fresh job of 3 steps ends elsewhere.
  const std::vector<float> three = run(ckpt("fresh"), kSteps / 2, &restored);
  EXPECT_NE(three, whole);
}

// Deferred init: after step 5 every worker declares a new key (a layer whose shape is known
// only now) with values from its own seed; FinishDeclarations extends the shard map on every
// worker and server, Broadcast gives all rank 0's values, and training goes on with both keys.
TEST_P(DatapathTest, KeyAddedAtStep5EndsIdenticalOnAllWorkers) {
  constexpr int kServers = 2, kWorkers = 3, kIn = 24, kLate = 50, kSteps = 8;
  StartJob(kServers, kWorkers, 64);  // 16 floats per slice: the late key spans both servers
  std::vector<std::vector<float>> w_end(kWorkers), late_end(kWorkers), late_start(kWorkers);
  auto results = RunWorkers([&](Worker& worker) {
    const int rank = worker.rank();
    std::mt19937 rng(77 + rank);  // every worker its own seed
    std::normal_distribution<float> nd;
    std::vector<float> w(kIn), late;
    for (auto& x : w) x = nd(rng);
    Status st = worker.DeclareKey({.id = 0, .name = "w", .num_elements = kIn});
    if (st.ok()) st = worker.FinishDeclarations();
    if (st.ok()) st = worker.Broadcast(0, w.data(), 0).Wait();
    for (int step = 1; st.ok() && step <= kSteps; ++step) {
      std::vector<float> g(kIn), sum(kIn);
      for (int i = 0; i < kIn; ++i) g[i] = 0.1f * w[i] + 0.01f * (rank + 1) * step;
      st = worker.PushPull(0, g.data(), sum.data()).Wait();
      for (int i = 0; st.ok() && i < kIn; ++i) w[i] -= 0.1f * sum[i] / kWorkers;
      if (st.ok() && !late.empty()) {
        std::vector<float> lg(kLate), lsum(kLate);
        for (int i = 0; i < kLate; ++i) lg[i] = late[i] * 0.5f + 0.001f * rank;
        st = worker.PushPull(9, lg.data(), lsum.data()).Wait();
        for (int i = 0; st.ok() && i < kLate; ++i) late[i] -= 0.2f * lsum[i] / kWorkers;
      }
      if (st.ok() && step == 5) {
        late.resize(kLate);
        for (auto& x : late) x = nd(rng);
        st = worker.DeclareKey({.id = 9, .name = "late", .num_elements = kLate});
        if (st.ok()) st = worker.FinishDeclarations();
        if (st.ok()) st = worker.Broadcast(9, late.data(), 0).Wait();
        late_start[rank] = late;
      }
    }
    w_end[rank] = w;
    late_end[rank] = late;
    return st;
  });
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(results[r].ok()) << "worker " << r << ": " << results[r].ToString();
  }
  ASSERT_EQ(late_end[0].size(), size_t{kLate});
  EXPECT_NE(late_end[0], late_start[0]);  // it trained
  for (int r = 1; r < kWorkers; ++r) {
    EXPECT_EQ(late_start[r], late_start[0]) << "worker " << r << " after the broadcast";
    EXPECT_EQ(late_end[r], late_end[0]) << "worker " << r;
    EXPECT_EQ(w_end[r], w_end[0]) << "worker " << r;
  }
}

// A key declared late by only some workers: each of them gets an error naming the key and the
// worker that did not declare it, after a bounded wait (the worker's timeout), not a hang.
TEST_P(DatapathTest, KeyDeclaredLateByOnlySomeWorkersIsAClearError) {
  constexpr int kWorkers = 3;
  StartJob(1, kWorkers, 1 << 20);
  auto results = RunWorkers(
      [&](Worker& worker) {
        std::vector<float> v(4, 1.0f);
        Status st = worker.DeclareKey({.id = 0, .name = "w", .num_elements = 4});
        if (st.ok()) st = worker.FinishDeclarations();
        if (st.ok()) st = worker.PushPull(0, v.data(), v.data()).Wait();
        if (st.ok() && worker.rank() != 2) {
          st = worker.DeclareKey({.id = 9, .name = "late", .num_elements = 4});
          if (st.ok()) st = worker.FinishDeclarations();
          // The failed round leaves the key undeclared: usable again after a fix.
          if (!st.ok() && worker.PushPull(9, v.data(), v.data()).Wait().message() !=
                              "PushPull of undeclared key 9") {
            st = InternalError("key 9 usable after a failed round");
          }
        }
        return st;
      },
      /*timeout_ms=*/3000);
  for (int r = 0; r < kWorkers; ++r) {
    if (worker_ranks_[r] == 2) {
      EXPECT_TRUE(results[r].ok()) << results[r].ToString();
      continue;
    }
    EXPECT_EQ(results[r].code(), StatusCode::kDeadlineExceeded) << results[r].ToString();
    EXPECT_NE(results[r].message().find("key declaration after training started: key 9 \"late\" "
                                        "declared by 2 of 3 workers; worker 2 did not declare it"),
              std::string::npos)
        << results[r].ToString();
  }
}

// A worker holding the wrong token is refused by the scheduler before it touches a server, and
// a server that dies turns pending operations into errors naming it, never a hang.
TEST_P(DatapathTest, WrongTokenAndDeadServer) {
  StartJob(1, 1, 1 << 20);
  {
    std::string bad = (dir_ / "bad-token").string();
    std::ofstream(bad) << "not-the-token\n";
    WorkerOptions o = Options(worker_ranks_[0]);
    o.token_file = bad;
    o.timeout_ms = 5000;
    auto wk = Worker::Create(o);
    ASSERT_FALSE(wk.ok());
    EXPECT_EQ(wk.status().code(), StatusCode::kUnauthenticated) << wk.status().ToString();
  }
  auto wk = Worker::Create(Options(worker_ranks_[0]));
  ASSERT_TRUE(wk.ok()) << wk.status().ToString();
  ASSERT_TRUE((*wk)->DeclareKey({.id = 1, .name = "k", .num_elements = 8}).ok());
  ASSERT_TRUE((*wk)->FinishDeclarations().ok());
  std::vector<float> g(8, 1.0f), out(8);
  ASSERT_TRUE((*wk)->PushPull(1, g.data(), out.data()).Wait().ok());
  EXPECT_EQ(out, g);
  ASSERT_TRUE(servers_[0]->Signal(SIGKILL).ok());
  ASSERT_TRUE(servers_[0]->WaitFor(std::chrono::seconds(10)).has_value());
  Status st = (*wk)->PushPull(1, g.data(), out.data()).Wait();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("PushPull key 1 (k) step 2: slice 0 on server 0"), std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace trellis
