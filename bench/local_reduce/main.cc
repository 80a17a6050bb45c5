// bench_local_reduce [--mib N]
//  1. Bytes the servers receive per training step: P = 2 pods of G processes as G*P plain
//     workers, against the same processes as local groups (reduce in the pod, send once).
//     Goal: the grouped figure is 1/G of the plain one.
//  2. The CPU (shared-memory) local group: reduce-scatter and all-gather of N MiB per local
//     rank, G = 2 and 4 (one thread per local rank, each with its own mapping, as processes
//     would have), next to single-thread memcpy of the same size in the same run.
// Everything runs on 127.0.0.1; a loaded machine shows in both figures of a ratio alike.
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <thread>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "tests/unit/worker-lib/local_cluster.h"

namespace trellis::bench {
namespace {

// Bytes pushed per step, over all processes of the job.
StatusOr<double> PushedPerStep(int pods, int g, bool grouped, int64_t elements) {
  testing::ClusterOptions o;
  o.servers = 2;
  o.transport = "tcp";
  o.workers = grouped ? pods : pods * g;
  o.local_size = grouped ? g : 1;
  testing::LocalCluster c;
  TRELLIS_RETURN_IF_ERROR(c.Start(o));
  std::vector<KeyDecl> keys;
  for (int k = 0; k < 4; ++k) {  // four layers of a quarter each
    keys.push_back({.id = static_cast<KeyId>(k), .name = "", .num_elements = elements / 4});
  }
  TRELLIS_RETURN_IF_ERROR(c.Declare(keys));
  constexpr int kSteps = 3;
  std::vector<Status> errors(c.workers.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < c.workers.size(); ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::vector<float>> grad(4, std::vector<float>(elements / 4, 1.0f));
      for (int s = 0; s < kSteps && errors[r].ok(); ++s) {
        std::vector<Handle> h;
        for (int k = 3; k >= 0; --k) {
          h.push_back(c.workers[r]->PushPull(k, grad[k].data(), grad[k].data(), -k));
        }
        for (auto& x : h) {
          if (Status st = x.Wait(); !st.ok()) errors[r] = st;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  uint64_t bytes = 0;
  for (size_t r = 0; r < c.workers.size(); ++r) {
    TRELLIS_RETURN_IF_ERROR(errors[r]);
    bytes += c.workers[r]->bytes_pushed();
  }
  return static_cast<double>(bytes) / kSteps;
}

// Seconds per collective (best of a few), G threads on one shm group.
StatusOr<std::pair<double, double>> LocalCollectives(int g, int64_t n) {
  const std::string name = "bench" + std::to_string(getpid()) + "-g" + std::to_string(g);
  std::vector<double> rs(g), ag(g);
  std::vector<Status> errors(g);
  std::vector<std::thread> threads;
  for (int r = 0; r < g; ++r) {
    threads.emplace_back([&, r] {
      LocalGroupOptions o;
      o.name = name;
      o.rank = r;
      o.size = g;
      auto group = OpenShmLocalGroup(o);
      if (!group.ok()) {
        errors[r] = group.status();
        return;
      }
      std::vector<float> in(n, 1.0f + r), part(LocalPart(n, g, r).count), out(n);
      double best_rs = 1e30, best_ag = 1e30;
      for (int i = 0; i < 5; ++i) {
        auto t0 = Clock::now();
        if (Status s = (*group)->ReduceScatter(in.data(), n, part.data()); !s.ok()) errors[r] = s;
        auto t1 = Clock::now();
        if (Status s = (*group)->AllGather(part.data(), n, out.data()); !s.ok()) errors[r] = s;
        auto t2 = Clock::now();
        best_rs = std::min(best_rs, std::chrono::duration<double>(t1 - t0).count());
        best_ag = std::min(best_ag, std::chrono::duration<double>(t2 - t1).count());
      }
      rs[r] = best_rs;
      ag[r] = best_ag;
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) TRELLIS_RETURN_IF_ERROR(e);
  // A collective ends when its slowest rank does.
  return std::make_pair(*std::max_element(rs.begin(), rs.end()),
                        *std::max_element(ag.begin(), ag.end()));
}

double MemcpySeconds(int64_t n) {
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    best = std::min(best, SecondsSince(t0));
  }
  if (b[n / 2] != 1.0f) std::cerr << "memcpy check failed\n";
  return best;
}

int Main(int argc, char** argv) {
  int64_t mib = 16;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--mib") mib = std::atoll(argv[++i]);
  }
  const int64_t n = mib * (1 << 20) / 4;
  std::cout << "bench_local_reduce: " << std::thread::hardware_concurrency()
            << " hardware threads\n\n";

  std::cout << "Bytes the servers receive per step (2 pods, 2 servers, TCP on loopback, "
            << FormatBytes(static_cast<uint64_t>(n / 4 * 4)) << " of gradients per process):\n";
  Table bytes({"G", "processes", "plain workers", "local groups", "grouped / plain", "goal"});
  for (int g : {2, 4}) {
    auto plain = PushedPerStep(2, g, false, n / 4);
    auto grouped = PushedPerStep(2, g, true, n / 4);
    if (!plain.ok() || !grouped.ok()) {
      std::cerr << (plain.ok() ? grouped.status() : plain.status()).ToString() << "\n";
      return 1;
    }
    bytes.AddRow({std::to_string(g), std::to_string(2 * g),
                  FormatBytes(static_cast<uint64_t>(*plain)),
                  FormatBytes(static_cast<uint64_t>(*grouped)), Fixed(*grouped / *plain, 3),
                  Fixed(1.0 / g, 3)});
  }
  bytes.Print(std::cout);

  const double copy = MemcpySeconds(n);
  const double copy_gbs = n * 4.0 / copy / 1e9;
  std::cout << "\nCPU local group (shared memory), " << mib << " MiB per local rank; memcpy "
            << Fixed(copy_gbs, 2) << " GB/s in this run:\n";
  Table tput({"G", "reduce-scatter GB/s", "vs memcpy", "all-gather GB/s", "vs memcpy"});
  for (int g : {2, 4}) {
    auto t = LocalCollectives(g, n);
    if (!t.ok()) {
      std::cerr << t.status().ToString() << "\n";
      return 1;
    }
    // Throughput: each local rank's tensor bytes per second of the collective.
    const double rs = n * 4.0 / t->first / 1e9, ag = n * 4.0 / t->second / 1e9;
    tput.AddRow({std::to_string(g), Fixed(rs, 2), Fixed(rs / copy_gbs, 2), Fixed(ag, 2),
                 Fixed(ag / copy_gbs, 2)});
  }
  tput.Print(std::cout);
  return 0;
}

}  // namespace
}  // namespace trellis::bench

int main(int argc, char** argv) { return trellis::bench::Main(argc, argv); }
