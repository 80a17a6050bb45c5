// Real processes on loopback: the scheduler (in this process), S trellis-pserver processes
// started as an agent would (TRELLIS_SCHEDULER, TRELLIS_RANK, TRELLIS_TOKEN_FILE), and W workers
// created from the environment contract with Worker::Create, one thread each.
#include <unistd.h>

#include <csignal>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/env.h"
#include "common/subprocess.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "trellis/trellis.h"

namespace trellis {
namespace {

constexpr char kToken[] = "datapath-test-token";

std::string JobYaml(int servers, int workers, int64_t slice_bytes, const std::string& transport) {
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: dp\nspec:\n"
         "  image: trellis:latest\n  servers:\n    replicas: " + std::to_string(servers) +
         "\n  workers:\n    replicas: " + std::to_string(workers) +
         "\n    command: [none]\n  serverMode: aggregate\n  transport: " + transport +
         "\n  sliceBytes: " +
         std::to_string(slice_bytes) + "\n  priority:\n    enabled: true\n    waterMark: 4\n";
}

// Each case over both data paths, chosen the way users choose it: spec.transport in the job.
class DatapathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void StartJob(int servers, int workers, int64_t slice_bytes) {
    dir_ = std::filesystem::temp_directory_path() /
           ("trellis-datapath-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    token_file_ = (dir_ / "token").string();
    std::ofstream(token_file_) << kToken << "\n";

    SchedulerConfig config;
    config.job_name = "dp";
    config.num_servers = servers;
    config.num_workers = workers;
    config.slice_bytes = slice_bytes;
    SchedulerServerOptions so;
    so.host = "127.0.0.1";
    so.service.token = kToken;
    so.service.job_yaml = JobYaml(servers, workers, slice_bytes, GetParam());
    auto sched = SchedulerServer::Start(config, so);
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    scheduler_ = std::move(*sched);
    auto client = SchedulerClient::Connect({scheduler_->address(), kToken});
    ASSERT_TRUE(client.ok());
    client_ = std::move(*client);
    // What the agents do: register every pod, then start the role's program with its rank.
    for (int s = 0; s < servers; ++s) {
      v1::RegisterRequest r;
      r.set_job("dp");
      r.set_role(v1::ROLE_SERVER);
      r.set_pod_name("server-" + std::to_string(s));
      r.set_host("127.0.0.1");
      auto resp = client_->Register(r);
      ASSERT_TRUE(resp.ok()) << resp.status().ToString();
      SpawnOptions o;
      o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-pserver", "--listen", "127.0.0.1",
                "--port", "0"};
      o.env = CurrentEnvironment();
      o.env["TRELLIS_SCHEDULER"] = scheduler_->address();
      o.env["TRELLIS_RANK"] = std::to_string(resp->rank());
      o.env["TRELLIS_TOKEN_FILE"] = token_file_;
      o.env["TRELLIS_HOST"] = "127.0.0.1";
      auto p = Subprocess::Start(o);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      servers_.push_back(std::move(*p));
    }
    for (int w = 0; w < workers; ++w) {
      v1::RegisterRequest r;
      r.set_job("dp");
      r.set_role(v1::ROLE_WORKER);
      r.set_pod_name("worker-" + std::to_string(w));
      r.set_host("127.0.0.1");
      auto resp = client_->Register(r);
      ASSERT_TRUE(resp.ok()) << resp.status().ToString();
      worker_ranks_.push_back(resp->rank());
    }
  }
  void TearDown() override {
    servers_.clear();  // SIGTERM, then SIGKILL after the grace period; reaped
    client_.reset();
    scheduler_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  WorkerOptions Options(int rank) const {
    WorkerOptions o;
    o.scheduler_address = scheduler_->address();
    o.token_file = token_file_;
    o.rank = rank;
    o.timeout_ms = 20000;
    return o;
  }

  std::filesystem::path dir_;
  std::string token_file_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<SchedulerClient> client_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::vector<int> worker_ranks_;
};

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
