#include "bench/pushpull/trellis_pushpull.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "bench/common/poll.h"
#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "scheduler/scheduler_client.h"
#include "trellis/trellis.h"

namespace trellis::bench {
namespace {

constexpr char kJobName[] = "bench-pushpull";
constexpr auto kStartDeadline = std::chrono::seconds(30);
constexpr int64_t kOperationTimeoutMs = 30000;  // a stuck step fails instead of hanging the bench
// One GetCluster long poll; the scheduler answers a little before it with the view as it is.
constexpr auto kClusterPoll = std::chrono::milliseconds(500);

// TRELLIS_TLS_* of this process for one measurement: the scheduler and servers inherit them, the
// worker threads' Worker::Create and the bench's own scheduler client read them.
class ScopedTlsEnv {
 public:
  explicit ScopedTlsEnv(const TlsFiles& files) {
    Clear();
    std::map<std::string, std::string> env;
    AddTlsEnv(files, &env);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~ScopedTlsEnv() { Clear(); }

 private:
  static void Clear() {
    for (const char* k : {kEnvTlsCaFile, kEnvTlsCertFile, kEnvTlsKeyFile, kEnvTlsServerName}) {
      ::unsetenv(k);
    }
  }
};

// The scheduler and the servers as real processes on loopback. The bench plays the agent's part
// (DESIGN: the agent registers a pod, then starts its program with TRELLIS_RANK).
class Cluster {
 public:
  static StatusOr<std::unique_ptr<Cluster>> Start(const TrellisRunOptions& options);
  // Servers first, then the scheduler: every process this object started is ended.
  ~Cluster() {
    for (auto& server : servers_) server->Stop(std::chrono::seconds(2));
    if (scheduler_) scheduler_->Stop(std::chrono::seconds(2));
  }

  const std::string& scheduler_address() const { return scheduler_address_; }
  const std::string& token_file() const { return token_file_; }
  const std::vector<int>& worker_ranks() const { return worker_ranks_; }
  // CPU seconds used so far by the bench process (all its workers) and every server.
  double CpuSeconds() const {
    double s = ProcessCpuSeconds();
    for (const auto& server : servers_) s += ProcessCpuSeconds(server->pid());
    return s;
  }

 private:
  Cluster() = default;
  Status StartScheduler(const TrellisRunOptions& options);
  Status StartServers(const TrellisRunOptions& options, SchedulerClient& client);

  std::string scheduler_address_;
  std::string token_file_;
  std::unique_ptr<Subprocess> scheduler_;
  std::vector<std::unique_ptr<Subprocess>> servers_;
  std::vector<int> worker_ranks_;  // as the scheduler assigned them to our registrations
};

SpawnOptions ChildSpawn(const std::string& program, std::vector<std::string> args,
                        const std::string& log_path) {
  SpawnOptions spawn;
  spawn.argv = std::move(args);
  spawn.argv.insert(spawn.argv.begin(), program);
  spawn.env = CurrentEnvironment();
  spawn.stdout_mode = SpawnOptions::Output::kFile;
  spawn.stdout_path = log_path;
  spawn.stderr_mode = SpawnOptions::Output::kStdout;
  return spawn;
}

// Waits for the scheduler's port file (written atomically once it serves). Polling a file is the
// one way to learn about another process here; the poll is short and bounded by a deadline.
StatusOr<int> WaitForPortFile(const std::string& path, Subprocess& scheduler,
                              const std::string& log_path) {
  const auto deadline = Clock::now() + kStartDeadline;
  while (Clock::now() < deadline) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    if (auto exit = scheduler.Poll()) {
      return UnavailableError("trellis-scheduler " + exit->Describe() + " before serving (see " + log_path + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return DeadlineExceededError("trellis-scheduler did not write " + path + " within 30 s");
}

Status Cluster::StartScheduler(const TrellisRunOptions& options) {
  const TrellisTopology& t = options.topology;
  const std::string tag = std::to_string(t.workers) + "x" + std::to_string(t.servers);
  const std::string port_file = options.log_dir + "/scheduler-" + tag + ".port";
  std::remove(port_file.c_str());
  // The job every process reads from the scheduler. The workers are this bench's threads, so
  // their command is only a label; the data-path settings are the job defaults unless given.
  const std::string job_file = options.log_dir + "/job-" + tag + ".yaml";
  {
    std::ofstream job(job_file, std::ios::trunc);
    job << "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " << kJobName
        << "\nspec:\n  servers:\n    replicas: " << t.servers << "\n  workers:\n    replicas: "
        << t.workers << "\n    command: [bench_pushpull]\n";
    if (options.slice_bytes > 0) job << "  sliceBytes: " << options.slice_bytes << "\n";
    if (!options.retain_pushes) job << "  recovery: {retainPushes: false}\n";
    if (!job) return UnavailableError("cannot write " + job_file);
  }
  SpawnOptions spawn = ChildSpawn(
      options.bin_dir + "/trellis-scheduler",
      {"--num-servers", std::to_string(t.servers), "--num-workers", std::to_string(t.workers),
       "--host", "127.0.0.1", "--port", "0", "--port-file", port_file, "--token-file", token_file_,
       "--job-file", job_file, "--job-name", kJobName, "--heartbeat-timeout", "60"},
      options.log_dir + "/scheduler-" + tag + ".log");
  TRELLIS_ASSIGN_OR_RETURN(scheduler_, Subprocess::Start(spawn));
  TRELLIS_ASSIGN_OR_RETURN(int port, WaitForPortFile(port_file, *scheduler_, spawn.stdout_path));
  scheduler_address_ = "127.0.0.1:" + std::to_string(port);
  return Status::Ok();
}

Status Cluster::StartServers(const TrellisRunOptions& options, SchedulerClient& client) {
  const TrellisTopology& t = options.topology;
  for (int i = 0; i < t.servers; ++i) {
    v1::RegisterRequest reg;
    reg.set_job(kJobName);
    reg.set_role(v1::ROLE_SERVER);
    reg.set_pod_name("bench-server-" + std::to_string(i));
    reg.set_host("127.0.0.1");
    TRELLIS_ASSIGN_OR_RETURN(v1::RegisterResponse registered, client.Register(reg));
    const std::string rank = std::to_string(registered.rank());
    SpawnOptions spawn = ChildSpawn(options.bin_dir + "/trellis-pserver", {"--rank", rank},
                                    options.log_dir + "/pserver-" + std::to_string(t.workers) + "x" +
                                        std::to_string(t.servers) + "-" + rank + ".log");
    spawn.env["TRELLIS_SCHEDULER"] = scheduler_address_;
    spawn.env["TRELLIS_TOKEN_FILE"] = token_file_;
    spawn.env["TRELLIS_JOB"] = kJobName;
    spawn.env["TRELLIS_ROLE"] = "server";
    spawn.env["TRELLIS_NUM_SERVERS"] = std::to_string(t.servers);
    spawn.env["TRELLIS_NUM_WORKERS"] = std::to_string(t.workers);
    spawn.env["TRELLIS_RANK"] = rank;
    spawn.env["TRELLIS_HOST"] = "127.0.0.1";
    // "tcp": raw TCP as the echo baseline uses it; "local": the same protocol over the servers'
    // local sockets (docs/architecture.md), still against the TCP echo.
    spawn.env["TRELLIS_LOCAL_SOCKET"] = options.transport == "local" ? "on" : "off";
    TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> server, Subprocess::Start(spawn));
    servers_.push_back(std::move(server));
  }
  for (int i = 0; i < t.workers; ++i) {
    v1::RegisterRequest reg;
    reg.set_job(kJobName);
    reg.set_role(v1::ROLE_WORKER);
    reg.set_pod_name("bench-worker-" + std::to_string(i));
    reg.set_host("127.0.0.1");
    TRELLIS_ASSIGN_OR_RETURN(v1::RegisterResponse registered, client.Register(reg));
    worker_ranks_.push_back(registered.rank());
  }
  // Every server serving and reported ready before the first worker joins. Short polls, so a
  // server that dies at start-up is reported at once rather than at the deadline; a poll that
  // comes back late on a loaded machine is retried (PollUntil), only the total is bounded.
  return PollUntil(
      [&]() -> StatusOr<bool> {
        // A child that died is final (ABORTED, not retried), unlike a late answer.
        if (auto exit = scheduler_->Poll()) {
          return AbortedError("trellis-scheduler " + exit->Describe() + " (see its log in " +
                              options.log_dir + ")");
        }
        for (size_t i = 0; i < servers_.size(); ++i) {
          if (auto exit = servers_[i]->Poll()) {
            return AbortedError("trellis-pserver " + std::to_string(i) + " " + exit->Describe() +
                                " before serving (see its log in " + options.log_dir + ")");
          }
        }
        TRELLIS_ASSIGN_OR_RETURN(v1::ClusterView view,
                                 client.GetCluster(0, /*wait_complete=*/true, kClusterPoll));
        if (view.complete()) return true;
        if (view.failed()) return AbortedError("the job failed: " + view.failure_message());
        return false;
      },
      kStartDeadline, "the servers did not report ready");
}

StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const TrellisRunOptions& options) {
  std::unique_ptr<Cluster> cluster(new Cluster());
  cluster->token_file_ = options.log_dir + "/token";
  const std::string token = "bench-token-" + std::to_string(getpid());
  {
    std::ofstream out(cluster->token_file_, std::ios::trunc);
    out << token << "\n";
    if (!out) return UnavailableError("cannot write " + cluster->token_file_);
  }
  TRELLIS_RETURN_IF_ERROR(cluster->StartScheduler(options));
  TRELLIS_ASSIGN_OR_RETURN(TlsPtr tls, LoadTls(options.tls));
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<SchedulerClient> client,
                           SchedulerClient::Connect({.address = cluster->scheduler_address_,
                                                     .token = token,
                                                     .tls = tls}));
  TRELLIS_RETURN_IF_ERROR(cluster->StartServers(options, *client));
  return cluster;
}

// What the worker threads share: a barrier per phase, and the step count each phase runs
// (the same on every worker, or the sums would wait for a step some worker never sends).
struct Shared {
  explicit Shared(int workers) : sync(workers) {}
  std::barrier<> sync;
  std::mutex mu;
  Status first_error;                // GUARDED_BY(mu)
  std::vector<double> warmup_step_s;  // GUARDED_BY(mu): median warm-up step per size, slowest worker
  std::vector<int> steps;             // GUARDED_BY(mu): measured steps per size
  std::vector<std::vector<TrellisSizeResult>> per_worker;  // [worker][size], GUARDED_BY(mu)
  std::atomic<bool> failed{false};

  void Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (first_error.ok()) first_error = s;
    failed.store(true);
  }
};

int WarmupSteps(uint64_t bytes) { return bytes >= (16ull << 20) ? 3 : bytes >= (1ull << 20) ? 5 : 50; }

// One step: push this worker's gradient, pull the sum, and check it (every worker pushes
// rank+1 everywhere, so every element of the sum is W(W+1)/2).
Status Step(Worker& worker, KeyId key, const std::vector<float>& grad, std::vector<float>& out, float expected) {
  TRELLIS_RETURN_IF_ERROR(worker.PushPull(key, grad.data(), out.data()).Wait());
  for (size_t i : {size_t{0}, out.size() / 2, out.size() - 1}) {
    if (out[i] != expected) {
      return DataLossError("key " + std::to_string(key) + " element " + std::to_string(i) + ": sum is " +
                           std::to_string(out[i]) + ", expected " + std::to_string(expected));
    }
  }
  return Status::Ok();
}

Status RunWorker(const TrellisRunOptions& options, const Cluster& cluster, int index, Shared& shared) {
  WorkerOptions wo;
  wo.scheduler_address = cluster.scheduler_address();
  wo.token_file = cluster.token_file();
  wo.rank = cluster.worker_ranks()[index];
  wo.timeout_ms = kOperationTimeoutMs;
  wo.transport = options.transport == "local" ? "tcp" : options.transport;
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create(wo));
  const int w = options.topology.workers;
  const float expected = static_cast<float>(w * (w + 1) / 2);
  std::vector<std::vector<float>> grads, outs;
  for (size_t k = 0; k < options.sizes.size(); ++k) {
    const int64_t n = static_cast<int64_t>(options.sizes[k] / sizeof(float));
    TRELLIS_RETURN_IF_ERROR(worker->DeclareKey({.id = k, .name = "bench/" + FormatBytes(options.sizes[k]), .num_elements = n}));
    grads.emplace_back(n, static_cast<float>(worker->rank() + 1));
    outs.emplace_back(n, 0.0f);
  }
  TRELLIS_RETURN_IF_ERROR(worker->FinishDeclarations());

  for (size_t k = 0; k < options.sizes.size(); ++k) {
    Samples warmup;
    for (int i = 0; i < WarmupSteps(options.sizes[k]); ++i) {
      const auto t0 = Clock::now();
      TRELLIS_RETURN_IF_ERROR(Step(*worker, k, grads[k], outs[k], expected));
      warmup.Add(SecondsSince(t0));
    }
    {
      // The median: the first steps of a key pay for allocations and would inflate the estimate.
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.warmup_step_s[k] = std::max(shared.warmup_step_s[k], warmup.Percentile(50));
    }
    shared.sync.arrive_and_wait();
    if (shared.failed.load()) return Status::Ok();
    int steps = 0;
    {
      // Every worker computes the same count from the same shared figure.
      std::lock_guard<std::mutex> lock(shared.mu);
      const double per_step = std::max(shared.warmup_step_s[k], 1e-6);
      steps = static_cast<int>(std::clamp(options.budget.max_seconds / per_step,
                                          static_cast<double>(options.budget.min_iters), 20000.0));
    }
    Samples latencies;
    const double cpu_start = index == 0 ? cluster.CpuSeconds() : 0;
    const auto start = Clock::now();
    for (int i = 0; i < steps; ++i) {
      const auto t0 = Clock::now();
      TRELLIS_RETURN_IF_ERROR(Step(*worker, k, grads[k], outs[k], expected));
      latencies.Add(SecondsSince(t0));
    }
    const double seconds = SecondsSince(start);
    const double cpu_s = index == 0 ? cluster.CpuSeconds() - cpu_start : 0;
    TrellisSizeResult r;
    r.cpu_s_per_step = cpu_s / steps;
    r.bytes = options.sizes[k];
    r.steps = steps;
    r.gbytes_per_s_per_worker = static_cast<double>(r.bytes) * steps / seconds / 1e9;
    r.p50_s = latencies.Percentile(50);
    r.p99_s = latencies.Percentile(99);
    {
      std::lock_guard<std::mutex> lock(shared.mu);
      shared.per_worker[index][k] = r;
    }
    shared.sync.arrive_and_wait();  // the next size starts together
    if (shared.failed.load()) return Status::Ok();
  }
  return Status::Ok();
}

}  // namespace

std::string TrellisTopology::Name() const {
  return std::to_string(workers) + "w x " + std::to_string(servers) + "s";
}

bool TrellisAvailable() { return true; }

StatusOr<std::vector<TrellisSizeResult>> MeasureTrellis(const TrellisRunOptions& options) {
  ScopedTlsEnv tls_env(options.tls);  // set before any process or worker thread starts
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, Cluster::Start(options));
  const int w = options.topology.workers;
  Shared shared(w);
  shared.warmup_step_s.assign(options.sizes.size(), 0);
  shared.per_worker.assign(w, std::vector<TrellisSizeResult>(options.sizes.size()));
  std::vector<std::thread> threads;
  for (int i = 0; i < w; ++i) {
    threads.emplace_back([&, i] {
      Status s = RunWorker(options, *cluster, i, shared);
      if (!s.ok()) {
        shared.Fail(s.Annotate("worker " + std::to_string(i)));
        shared.sync.arrive_and_drop();  // the others pass their barriers and see the failure
      }
    });
  }
  for (auto& t : threads) t.join();
  if (shared.failed.load()) return shared.first_error;
  // Goodput: the mean of the workers' own rates; latency: worker 0's steps.
  std::vector<TrellisSizeResult> results = shared.per_worker[0];
  for (size_t k = 0; k < results.size(); ++k) {
    double sum = 0;
    for (int i = 0; i < w; ++i) sum += shared.per_worker[i][k].gbytes_per_s_per_worker;
    results[k].gbytes_per_s_per_worker = sum / w;
  }
  return results;
}

}  // namespace trellis::bench
