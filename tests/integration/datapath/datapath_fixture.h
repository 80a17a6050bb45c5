// The data-path integration fixture: real processes on loopback, the scheduler (in this
// process), S trellis-pserver processes started as an agent would (TRELLIS_SCHEDULER,
// TRELLIS_RANK, TRELLIS_TOKEN_FILE), and W workers created from the environment contract with
// Worker::Create, one thread each. Shared by the test files of datapath_integration_test.
#pragma once

#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "trellis/checkpoint.h"
#include "trellis/trellis.h"

namespace trellis {
namespace datapath_testing {

inline constexpr char kToken[] = "datapath-test-token";

// `extra`: more spec fields, each line indented by two spaces; it may replace serverMode.
inline std::string JobYaml(int servers, int workers, int64_t slice_bytes,
                           const std::string& transport, const std::string& extra) {
  const bool mode_set = extra.find("serverMode:") != std::string::npos;
  return "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: dp\nspec:\n"
         "  image: trellis:latest\n  servers:\n    replicas: " + std::to_string(servers) +
         "\n  workers:\n    replicas: " + std::to_string(workers) + "\n    command: [none]\n" +
         (mode_set ? "" : "  serverMode: aggregate\n") + "  transport: " + transport +
         "\n  sliceBytes: " + std::to_string(slice_bytes) +
         "\n  priority:\n    enabled: true\n    waterMark: 4\n" + extra;
}

// Each case over both data paths, chosen the way users choose it: spec.transport in the job.
class DatapathTest : public ::testing::TestWithParam<std::string> {
 protected:
  void StartJob(int servers, int workers, int64_t slice_bytes, const std::string& extra = "") {
    dir_ = JobDir();
    std::filesystem::create_directories(dir_);
    worker_ranks_.clear();
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
    so.service.job_yaml = JobYaml(servers, workers, slice_bytes, GetParam(), extra);
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
      server_spawn_.push_back(o);
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
  static std::filesystem::path JobDir() {
    return std::filesystem::temp_directory_path() /
           ("trellis-datapath-" + std::to_string(::getpid()));
  }
  // Ends the job's processes (the directory stays: a later job may restore from it).
  void StopJob() {
    servers_.clear();  // SIGTERM, then SIGKILL after the grace period; reaped
    server_spawn_.clear();
    StopRestarter();  // after the servers: their processes die with it
    client_.reset();
    scheduler_.reset();
  }
  void TearDown() override {
    StopJob();
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

  // One thread per worker: Worker::Create from the environment contract, then `body`. Returns
  // each worker's status, by registration order.
  std::vector<Status> RunWorkers(const std::function<Status(Worker&)>& body,
                                 int64_t timeout_ms = 0) {
    std::vector<Status> results(worker_ranks_.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < worker_ranks_.size(); ++r) {
      threads.emplace_back([&, r] {
        WorkerOptions o = Options(worker_ranks_[r]);
        if (timeout_ms > 0) o.timeout_ms = timeout_ms;
        auto wk = Worker::Create(o);
        results[r] = wk.ok() ? body(**wk) : wk.status();
      });
    }
    for (auto& t : threads) t.join();
    return results;
  }

  // Kills server `s`'s process with SIGKILL and starts a fresh one as its agent would. Callable
  // from a worker thread: the new process is forked by a thread of the fixture that lives until
  // StopJob (a child dies with the thread that forked it: PR_SET_PDEATHSIG).
  Status KillAndRestartServer(int s) {
    std::promise<Status> done;
    auto result = done.get_future();
    {
      std::lock_guard lock(restart_mu_);
      restart_requests_.push_back({s, std::move(done)});
      if (!restarter_.joinable()) restarter_ = std::thread([this] { RestartLoop(); });
    }
    restart_cv_.notify_all();
    return result.get();
  }
  void RestartLoop() {
    std::unique_lock lock(restart_mu_);
    while (true) {
      restart_cv_.wait(lock, [this] { return stop_restarter_ || !restart_requests_.empty(); });
      if (stop_restarter_) return;
      auto [s, done] = std::move(restart_requests_.front());
      restart_requests_.erase(restart_requests_.begin());
      Status st = servers_[s]->Signal(SIGKILL);
      if (st.ok() && !servers_[s]->WaitFor(std::chrono::seconds(10))) {
        st = DeadlineExceededError("server " + std::to_string(s) + " survived SIGKILL");
      }
      if (st.ok()) {
        auto p = Subprocess::Start(server_spawn_[s]);
        if (p.ok()) {
          servers_[s] = std::move(*p);
        } else {
          st = p.status();
        }
      }
      done.set_value(st);
    }
  }
  void StopRestarter() {
    {
      std::lock_guard lock(restart_mu_);
      stop_restarter_ = true;
    }
    restart_cv_.notify_all();
    if (restarter_.joinable()) restarter_.join();
    stop_restarter_ = false;
  }

  std::filesystem::path dir_;
  std::string token_file_;
  std::unique_ptr<SchedulerServer> scheduler_;
  std::unique_ptr<SchedulerClient> client_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::vector<int> worker_ranks_;
  std::vector<SpawnOptions> server_spawn_;  // how each server was started
  std::mutex restart_mu_;
  std::condition_variable restart_cv_;
  std::vector<std::pair<int, std::promise<Status>>> restart_requests_;  // GUARDED_BY(restart_mu_)
  bool stop_restarter_ = false;                                        // GUARDED_BY(restart_mu_)
  std::thread restarter_;  // forks restarted servers (KillAndRestartServer)
};

}  // namespace datapath_testing
}  // namespace trellis
