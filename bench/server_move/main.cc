// bench_server_move [--mib N]... [--transport tcp|grpc]
// What a server resize costs at its step boundary: two workers on 127.0.0.1 train a model of N
// MiB (four layers, 1 MiB slices) on 2 servers, then every worker moves the slices to 3 servers
// (the boundary of the grow), trains, and moves them back to 2 (the shrink). The figure is the
// boundary's wall time (both workers moving at once, as in a job), next to the median time of a
// training step of the same model measured in the same run: the ratio says how many steps a
// resize costs. Aggregate mode moves each slice's last sum; update mode (Adam) its weights and
// both moments, three times the bytes.
#include <algorithm>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "scheduler/shard_map.h"
#include "tests/unit/worker-lib/local_cluster.h"

namespace trellis::bench {
namespace {

constexpr int64_t kSliceBytes = 1 << 20;
constexpr int kLayers = 4;

struct Figures {
  double step_s = 0;   // median step
  double grow_s = 0;   // the boundary that moves 2 -> 3
  double shrink_s = 0; // the boundary that moves 3 -> 2
};

std::vector<v1::KeySpec> Specs(int64_t elements) {
  std::vector<v1::KeySpec> out;
  for (int k = 0; k < kLayers; ++k) {
    v1::KeySpec s;
    s.set_id(k);
    s.set_num_elements(elements / kLayers);
    s.set_dtype(v1::DTYPE_FLOAT32);
    out.push_back(s);
  }
  return out;
}

StatusOr<Figures> Measure(int64_t mib, ServerMode mode, const std::string& transport) {
  const int64_t elements = mib * (1 << 20) / 4;
  testing::LocalCluster c;
  testing::ServerResizeScript script(2, kSliceBytes);  // the job starts on 2 of 3 servers
  testing::ClusterOptions o;
  o.servers = 3;
  o.workers = 2;
  o.slice_bytes = kSliceBytes;
  o.transport = transport;
  o.mode = mode;
  o.optimizer.type = OptimizerType::kAdam;
  o.retain_pushes = false;
  o.customize = [&script](int, WorkerSetup* s) { script.Hook(s); };
  TRELLIS_RETURN_IF_ERROR(c.Start(o));
  std::vector<KeyDecl> keys;
  for (int k = 0; k < kLayers; ++k) keys.push_back({.id = static_cast<KeyId>(k), .num_elements = elements / kLayers});
  TRELLIS_RETURN_IF_ERROR(c.Declare(keys));

  const auto decide = [&](int64_t epoch, int32_t servers, int64_t from) {
    return script.Decide(&c, epoch, 2, servers, from, Specs(elements));
  };

  // One step on both workers at once (their threads), then both boundaries at once; returns
  // the step's and the boundary's wall times.
  std::vector<std::vector<std::vector<float>>> grads(2);
  for (auto& g : grads) g.assign(kLayers, std::vector<float>(elements / kLayers, 0.001f));
  if (mode == ServerMode::kUpdate) {
    for (int k = 0; k < kLayers; ++k) {
      std::vector<float> w(elements / kLayers, 0.5f), got(elements / kLayers);
      Handle a = c.workers[0]->Broadcast(k, w.data(), 0);
      Handle b = c.workers[1]->Broadcast(k, got.data(), 0);
      TRELLIS_RETURN_IF_ERROR(a.Wait());
      TRELLIS_RETURN_IF_ERROR(b.Wait());
    }
  }
  const auto run_step = [&](int64_t step, double* step_s, double* boundary_s) -> Status {
    std::vector<Status> errors(2);
    auto t0 = Clock::now();
    {
      std::vector<std::thread> threads;
      for (int w = 0; w < 2; ++w) {
        threads.emplace_back([&, w] {
          std::vector<Handle> h;
          for (int k = kLayers - 1; k >= 0; --k) {
            h.push_back(c.workers[w]->PushPull(k, grads[w][k].data(), grads[w][k].data(), -k));
          }
          for (auto& x : h) {
            if (Status st = x.Wait(); !st.ok()) errors[w] = st;
          }
        });
      }
      for (auto& t : threads) t.join();
    }
    *step_s = SecondsSince(t0);
    for (const Status& st : errors) TRELLIS_RETURN_IF_ERROR(st);
    auto t1 = Clock::now();
    {
      std::vector<std::thread> threads;
      for (int w = 0; w < 2; ++w) {
        threads.emplace_back([&, w] {
          errors[w] = static_cast<WorkerImpl*>(c.workers[w].get())->AtStepBoundary(step);
        });
      }
      for (auto& t : threads) t.join();
    }
    *boundary_s = SecondsSince(t1);
    for (const Status& st : errors) TRELLIS_RETURN_IF_ERROR(st);
    return Status::Ok();
  };

  Figures f;
  Samples steps;
  double step_s = 0, boundary_s = 0;
  int64_t step = 0;
  for (int i = 0; i < 6; ++i) {  // the first two warm up
    TRELLIS_RETURN_IF_ERROR(run_step(++step, &step_s, &boundary_s));
    if (i >= 2) steps.Add(step_s);
  }
  // Grow: the new world starts two steps after the last one done, so the boundary of the next
  // step is where every worker moves the slices.
  TRELLIS_RETURN_IF_ERROR(decide(1, 3, step + 2));
  TRELLIS_RETURN_IF_ERROR(run_step(++step, &step_s, &boundary_s));
  f.grow_s = boundary_s;
  for (int i = 0; i < 3; ++i) {
    TRELLIS_RETURN_IF_ERROR(run_step(++step, &step_s, &boundary_s));
    steps.Add(step_s);
  }
  TRELLIS_RETURN_IF_ERROR(decide(2, 2, step + 2));
  TRELLIS_RETURN_IF_ERROR(run_step(++step, &step_s, &boundary_s));
  f.shrink_s = boundary_s;
  TRELLIS_RETURN_IF_ERROR(run_step(++step, &step_s, &boundary_s));
  steps.Add(step_s);
  f.step_s = steps.Percentile(50);
  if (c.workers[0]->num_servers() != 2 || c.workers[1]->num_servers() != 2) {
    return InternalError("the servers did not come back to 2");
  }
  return f;
}

int Main(int argc, char** argv) {
  std::vector<int64_t> sizes;
  std::string transport = "tcp";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      sizes.push_back(std::stoll(argv[++i]));
    } else if (a == "--transport" && i + 1 < argc) {
      transport = argv[++i];
    } else {
      std::cerr << "usage: bench_server_move [--mib N]... [--transport tcp|grpc]\n";
      return 2;
    }
  }
  if (sizes.empty()) sizes = {4, 32};
  std::cout << "bench_server_move: 2 workers, servers 2 -> 3 -> 2 on 127.0.0.1 (" << transport
            << "), " << std::thread::hardware_concurrency() << " cores\n";
  Table t({"model MiB", "mode", "step s (median)", "grow boundary s", "shrink boundary s",
           "grow / step", "shrink / step"});
  for (int64_t mib : sizes) {
    for (ServerMode mode : {ServerMode::kAggregate, ServerMode::kUpdate}) {
      auto f = Measure(mib, mode, transport);
      if (!f.ok()) {
        std::cerr << "bench_server_move: " << f.status().ToString() << "\n";
        return 1;
      }
      t.AddRow({std::to_string(mib), mode == ServerMode::kUpdate ? "update (Adam)" : "aggregate",
                Fixed(f->step_s, 4), Fixed(f->grow_s, 4), Fixed(f->shrink_s, 4),
                Fixed(f->grow_s / f->step_s, 2), Fixed(f->shrink_s / f->step_s, 2)});
    }
  }
  t.Print(std::cout);
  return 0;
}

}  // namespace
}  // namespace trellis::bench

int main(int argc, char** argv) { return trellis::bench::Main(argc, argv); }
