// S parameter servers and W workers in one process on 127.0.0.1:0, talking real gRPC or raw TCP
// (ClusterOptions.transport). The shard
// map is built with the scheduler's own BuildShardMap (what DeclareKeys returns).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pserver/parameter_server.h"
#include "pserver/tcp_wire.h"
#include "scheduler/shard_map.h"
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
      TRELLIS_ASSIGN_OR_RETURN(auto ps, ParameterServer::Start(po));
      addresses.push_back(tcpwire::JoinDataAddress("127.0.0.1:" + std::to_string(ps->port()),
                                                   ps->tcp_port()));
      servers.push_back(std::move(ps));
    }
    for (int w = 0; w < o.workers; ++w) {
      WorkerSetup setup;
      setup.rank = w;
      setup.num_workers = o.workers;
      setup.server_addresses = addresses;
      setup.token = o.token;
      setup.water_mark = o.water_mark;
      setup.timeout_ms = o.timeout_ms;
      setup.transport = o.transport;
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
      TRELLIS_ASSIGN_OR_RETURN(auto worker, CreateWorker(std::move(setup)));
      workers.push_back(std::move(worker));
    }
    return Status::Ok();
  }
  // Declares the same keys on every worker and finishes declarations.
  Status Declare(const std::vector<KeyDecl>& keys) {
    for (auto& w : workers) {
      for (const auto& k : keys) TRELLIS_RETURN_IF_ERROR(w->DeclareKey(k));
      TRELLIS_RETURN_IF_ERROR(w->FinishDeclarations());
    }
    return Status::Ok();
  }
  ~LocalCluster() {
    workers.clear();  // streams closed before the servers go
    servers.clear();
  }

  std::vector<std::unique_ptr<ParameterServer>> servers;
  std::vector<std::unique_ptr<Worker>> workers;

 private:
  std::shared_ptr<LocalBarrier> barrier_;
};

}  // namespace trellis::testing
