// S parameter servers and W workers in one process on 127.0.0.1:0, talking real gRPC or raw TCP
// (ClusterOptions.transport). The shard
// map is built with the scheduler's own BuildShardMap (what DeclareKeys returns).
// With local_size G > 1, `workers` are pods: each holds G LocalGroupWorkers (shared-memory
// local groups), so `workers` has workers * G entries indexed by global rank.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "pserver/parameter_server.h"
#include "datapath/address.h"
#include "scheduler/shard_map.h"
#include "worker-lib/src/local_group_worker.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis::testing {

// Barrier(name, generation) across the in-process workers, bounded by a deadline.
class LocalBarrier {
 public:
  explicit LocalBarrier(int n) : n_(n) {}
  Status Arrive(const std::string& name, int64_t gen, std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    auto key = name + "#" + std::to_string(gen);
    if (++count_[key] == n_) cv_.notify_all();
    if (!cv_.wait_for(lock, wait, [&] { return count_[key] >= n_; })) {
      return DeadlineExceededError("barrier " + name + " timed out");
    }
    return Status::Ok();
  }

 private:
  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> count_;  // GUARDED_BY(mu_)
};

// The sum of a series' samples whose labels contain `label` ("" : all), -1 if absent.
inline double CounterValue(const MetricsRegistry& r, const std::string& name,
                    const std::string& label = "") {
  const std::string text = r.Serialize();
  double sum = -1;
  for (size_t at = text.find("\n" + name + "{"); at != std::string::npos;
       at = text.find("\n" + name + "{", at + 1)) {
    const size_t end = text.find("} ", at);
    if (text.substr(at, end - at).find(label) == std::string::npos) continue;
    sum = std::max(sum, 0.0) + std::stod(text.substr(end + 2));
  }
  return sum;
}

struct ClusterOptions {
  int servers = 1;
  int workers = 1;
  int64_t slice_bytes = 4 << 20;
  ServerMode mode = ServerMode::kAggregate;
  OptimizerSpec optimizer;
  int64_t timeout_ms = 20000;
  int water_mark = 8;
  std::string token = "tok";
  std::string transport = "grpc";  // the workers' data path: "grpc" or "tcp"
  bool priority = true;            // the job's priority.enabled
  int local_size = 1;              // processes per worker pod (G)
  int64_t local_chunk_bytes = 1 << 20;
  BulkingOptions bulking;
  CompressionSpec compression;     // the job's spec.compression
  bool retain_pushes = true;       // the job's spec.recovery.retainPushes
  // Called on every worker's setup before the worker is made (e.g. scheduler hooks).
  std::function<void(int rank, WorkerSetup*)> customize;
};

class LocalCluster {
 public:
  Status Start(const ClusterOptions& o) {
    barrier_ = std::make_shared<LocalBarrier>(o.workers);
    std::vector<std::string> addresses;
    for (int s = 0; s < o.servers; ++s) {
      PserverOptions po;
      po.listen_host = "127.0.0.1";
      po.store.server_rank = s;
      po.store.num_workers = o.workers;
      po.store.mode = o.mode;
      po.store.optimizer = o.optimizer;
      po.service.token = o.token;
      po.service.pool_threads = 2;
      po.slice_bytes = o.slice_bytes;
      po.store.metrics = std::make_shared<MetricsRegistry>(MetricLabels{"local", "server", s});
      server_metrics.push_back(po.store.metrics);
      TRELLIS_ASSIGN_OR_RETURN(auto ps, ParameterServer::Start(po));
      addresses.push_back(
          DataAddress{"127.0.0.1:" + std::to_string(ps->port()), ps->tcp_port(), ""}.ToString());
      po.port = ps->port();  // a restart takes the same ports
      po.tcp_port = ps->tcp_port();
      server_options_.push_back(po);
      servers.push_back(std::move(ps));
    }
    {
      std::lock_guard lock(addresses_mu_);
      addresses_ = addresses;
    }
    options_ = o;
    std::vector<std::unique_ptr<Worker>> inner;
    for (int i = 0; i < o.workers * o.local_size; ++i) {
      const int w = i / o.local_size;  // the pod
      WorkerSetup setup = SetupFor(w);
      TRELLIS_ASSIGN_OR_RETURN(auto worker, CreateWorker(std::move(setup)));
      inner.push_back(std::move(worker));
    }
    if (o.local_size == 1) {
      workers = std::move(inner);
      return Status::Ok();
    }
    return GroupPods(o, std::move(inner));
  }
  // The setup Start gives worker `w` (tests add hooks and start a replacement worker with it).
  WorkerSetup SetupFor(int w) {
    const ClusterOptions& o = options_;
    WorkerSetup setup;
    setup.rank = w;
    setup.priority_enabled = o.priority;
    setup.num_workers = o.workers;
    {
      std::lock_guard lock(addresses_mu_);
      setup.server_addresses = addresses_;
    }
    setup.token = o.token;
    setup.water_mark = o.water_mark;
    setup.timeout_ms = o.timeout_ms;
    setup.transport = o.transport;
    setup.metrics = std::make_shared<MetricsRegistry>(MetricLabels{"local", "worker", w});
    worker_metrics.push_back(setup.metrics);
    setup.bulking = o.bulking;
    setup.compression = o.compression;
    setup.retain_pushes = o.retain_pushes;
    setup.resolve_server = [this](int32_t server, int64_t) { return AddressOf(server); };
    int ns = o.servers;
    int64_t sb = o.slice_bytes;
    setup.declare = [ns, sb](const std::vector<v1::KeySpec>& keys) {
      return BuildShardMap(keys, ns, "roundRobin", sb);
    };
    auto barrier = barrier_;
    int64_t t = o.timeout_ms;
    setup.barrier = [barrier, t](const std::string& name, int64_t gen) {
      return barrier->Arrive(name, gen, std::chrono::milliseconds(t));
    };
    if (o.customize) o.customize(w, &setup);
    return setup;
  }
  // Declares the same keys on every worker and finishes declarations.
  Status Declare(const std::vector<KeyDecl>& keys) {
    for (auto& w : workers) {
      for (const auto& k : keys) TRELLIS_RETURN_IF_ERROR(w->DeclareKey(k));
      TRELLIS_RETURN_IF_ERROR(w->FinishDeclarations());
    }
    return Status::Ok();
  }
  // Wraps each pod's G inner workers in LocalGroupWorkers; the G local ranks attach to their
  // shm groups concurrently (opening waits for all of them), as the pod's processes would.
  Status GroupPods(const ClusterOptions& o, std::vector<std::unique_ptr<Worker>> inner) {
    static std::atomic<int> cluster_id{0};
    const std::string base = "test" + std::to_string(getpid()) + "-" +
                             std::to_string(cluster_id.fetch_add(1));
    const int n = o.workers * o.local_size;
    std::vector<LocalGroupSetup> setups(n);
    std::vector<Status> errors(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        LocalGroupOptions lo;
        lo.name = base + "-p" + std::to_string(i / o.local_size);
        lo.rank = i % o.local_size;
        lo.size = o.local_size;
        lo.timeout_ms = o.timeout_ms;
        lo.chunk_bytes = o.local_chunk_bytes;
        LocalGroupSetup& s = setups[i];
        s.pod_rank = i / o.local_size;
        s.num_pods = o.workers;
        s.inner = std::move(inner[i]);
        lo.channel = "rs";
        auto r = OpenShmLocalGroup(lo);
        lo.channel = "ag";
        auto g = OpenShmLocalGroup(lo);
        if (!r.ok()) errors[i] = r.status();
        if (!g.ok()) errors[i] = g.status();
        if (r.ok() && g.ok()) {
          s.reduce = std::move(r).value();
          s.gather = std::move(g).value();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < n; ++i) {
      TRELLIS_RETURN_IF_ERROR(errors[i]);
      TRELLIS_ASSIGN_OR_RETURN(auto w, CreateLocalGroupWorker(std::move(setups[i])));
      workers.push_back(std::move(w));
    }
    return Status::Ok();
  }
  // A server's current data address (the scheduler's cluster view in a real job).
  StatusOr<std::string> AddressOf(int32_t server) {
    std::lock_guard lock(addresses_mu_);
    if (server < 0 || server >= static_cast<int32_t>(addresses_.size()) ||
        addresses_[server].empty()) {
      return UnavailableError("server " + std::to_string(server) + " is not running");
    }
    return addresses_[server];
  }
  // Stops server `s` (its state is gone, as when its process dies).
  void StopServer(int s) {
    {
      std::lock_guard lock(addresses_mu_);
      addresses_[s].clear();
    }
    servers[s].reset();
  }
  // Starts a fresh server `s` on its old ports, or on new ones (`same_ports` false).
  Status RestartServer(int s, bool same_ports = true) {
    if (servers[s]) StopServer(s);
    PserverOptions po = server_options_[s];
    if (!same_ports) po.port = po.tcp_port = 0;
    TRELLIS_ASSIGN_OR_RETURN(servers[s], ParameterServer::Start(po));
    std::lock_guard lock(addresses_mu_);
    addresses_[s] = DataAddress{"127.0.0.1:" + std::to_string(servers[s]->port()),
                                servers[s]->tcp_port(), ""}
                        .ToString();
    return Status::Ok();
  }

  ~LocalCluster() {
    workers.clear();  // streams closed before the servers go
    servers.clear();
  }

  std::vector<std::unique_ptr<ParameterServer>> servers;
  std::vector<std::unique_ptr<Worker>> workers;
  // Each process's registry, as Worker::Create and trellis-pserver would make them.
  std::vector<std::shared_ptr<MetricsRegistry>> server_metrics;
  std::vector<std::shared_ptr<MetricsRegistry>> worker_metrics;

 private:
  std::shared_ptr<LocalBarrier> barrier_;
  std::vector<PserverOptions> server_options_;  // as started, with the ports they got
  ClusterOptions options_;
  std::mutex addresses_mu_;
  std::vector<std::string> addresses_;  // GUARDED_BY(addresses_mu_): empty while stopped
};

// A server resize decided by a test or bench in place of the scheduler: the workers start on the
// first `first` of the cluster's servers (room for all of them), and every report of a step
// boundary gets the decision of the latest Decide (worker-lib/src/server_resize.h).
class ServerResizeScript {
 public:
  ServerResizeScript(int32_t first, int64_t slice_bytes) : first_(first), slice_bytes_(slice_bytes) {}

  // For ClusterOptions::customize. The script outlives the cluster's workers.
  void Hook(WorkerSetup* s) {
    s->server_slots = static_cast<int32_t>(s->server_addresses.size());
    s->server_addresses.resize(static_cast<size_t>(first_));
    s->declare = [n = first_, b = slice_bytes_](const std::vector<v1::KeySpec>& keys) {
      return BuildShardMap(keys, n, "roundRobin", b);
    };
    s->resize_epoch = [this] { return epoch_.load(); };
    s->reach_step = [this](const v1::ReachStepRequest&, std::chrono::milliseconds)
        -> StatusOr<v1::ReachStepResponse> {
      std::lock_guard lock(mu_);
      return decided_;
    };
  }

  // World `epoch` of workers 0..workers-1 on `servers` of `c`'s servers (the map of `keys` over
  // them), from step `from`: the workers switch at the boundary of step from-1.
  Status Decide(LocalCluster* c, int64_t epoch, int32_t workers, int32_t servers, int64_t from,
                const std::vector<v1::KeySpec>& keys) {
    v1::ReachStepResponse d;
    d.set_decided(true);
    d.mutable_world()->set_epoch(epoch);
    d.mutable_world()->set_from_step(from);
    for (int32_t w = 0; w < workers; ++w) d.mutable_world()->add_members(w);
    d.mutable_world()->set_servers(servers);
    TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap map, BuildShardMap(keys, servers, "roundRobin", slice_bytes_));
    map.set_world_epoch(epoch);
    *d.mutable_shard_map() = std::move(map);
    for (int32_t s = 0; s < servers; ++s) {
      TRELLIS_ASSIGN_OR_RETURN(std::string a, c->AddressOf(s));
      d.add_server_addresses(a);
    }
    {
      std::lock_guard lock(mu_);
      decided_ = std::move(d);
    }
    epoch_.store(epoch);
    return Status::Ok();
  }

 private:
  const int32_t first_;
  const int64_t slice_bytes_;
  std::atomic<int64_t> epoch_{0};  // what the pings announce
  std::mutex mu_;
  v1::ReachStepResponse decided_;  // GUARDED_BY(mu_)
};

}  // namespace trellis::testing
