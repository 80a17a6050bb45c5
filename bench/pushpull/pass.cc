#include "bench/pushpull/pass.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>

#include "bench/common/table.h"
#include "bench/pushpull/tcp_echo.h"
#include "bench/pushpull/tls_cost.h"

namespace trellis::bench {
namespace {

// Bulk budgets are in seconds per size so the whole bench stays bounded whatever the machine.
Budget BulkBudget(const Flags& f, uint64_t bytes) {
  Budget b;
  b.warmup_iters = bytes >= (16ull << 20) ? 1 : 20;
  b.min_iters = 3;
  b.max_iters = 1000000;
  b.max_seconds = f.seconds_per_size > 0 ? f.seconds_per_size : f.quick ? 0.3 : 1.5;
  return b;
}

Budget WarmupBudget() {
  Budget b;
  b.warmup_iters = 20;
  b.min_iters = 3;
  b.max_iters = 1000000;
  b.max_seconds = 0.5;
  return b;
}

Budget LatencyBudget(const Flags& f) {
  Budget b;
  b.warmup_iters = f.quick ? 50 : 200;
  b.min_iters = f.quick ? 300 : 2000;
  b.max_iters = b.min_iters;
  b.max_seconds = 20;  // a safety bound only; 2000 calls take well under a second normally
  return b;
}

std::string Us(double seconds) { return Fixed(seconds * 1e6, 0); }

// (a) raw TCP echo, every size; folded into `tcp` as the mean with an earlier pass.
Status TcpPass(const Flags& flags, const char* label, PassResult& pass) {
  std::map<uint64_t, double>& tcp = pass.tcp;
  std::map<uint64_t, double>& cpu = pass.tcp_cpu_s;
  for (uint64_t size : flags.sizes) {
    StatusOr<TcpEchoResult> r = MeasureTcpEcho(size, BulkBudget(flags, size));
    if (!r.ok()) return r.status().Annotate("tcp echo " + FormatBytes(size));
    tcp[size] = tcp.count(size) ? (tcp[size] + r->gbytes_per_s) / 2 : r->gbytes_per_s;
    cpu[size] = cpu.count(size) ? (cpu[size] + r->cpu_s_per_message) / 2 : r->cpu_s_per_message;
    std::cout << "  tcp echo " << label << " " << FormatBytes(size) << ": " << Fixed(r->gbytes_per_s, 2)
              << " GB/s, CPU " << Fixed(r->cpu_s_per_message * 1e3, 2) << " ms/msg (" << r->messages
              << " msgs, SO_SNDBUF " << r->socket_buffer_bytes << ")\n";
  }
  return Status::Ok();
}

// (b) and (c): the gRPC echo service.
Status GrpcPass(const Flags& flags, PassResult& pass) {
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<GrpcEchoServer> server, GrpcEchoServer::Start());
  StatusOr<LatencyResult> unary = MeasureGrpcUnary(server->address(), kLatencyBytes, LatencyBudget(flags));
  if (!unary.ok()) return unary.status().Annotate("grpc unary");
  pass.unary = *unary;
  std::cout << "  grpc unary    4 KiB: p50 " << Us(unary->p50_s) << " us, p99 " << Us(unary->p99_s)
            << " us (" << unary->calls << " calls)\n";
  for (uint64_t size : flags.sizes) {
    if (size < (1ull << 20)) continue;  // context figure for bulk sizes only
    StatusOr<StreamResult> r = MeasureGrpcStream(server->address(), size, BulkBudget(flags, size));
    if (!r.ok()) return r.status().Annotate("grpc stream " + FormatBytes(size));
    pass.stream[size] = *r;
    std::cout << "  grpc stream   " << FormatBytes(size) << ": " << Fixed(r->gbytes_per_s, 2) << " GB/s ("
              << r->messages << " msgs)\n";
  }
  return Status::Ok();
}

// (2) Trellis: every transport x topology. A column that fails is reported and left out.
void TrellisPass(const Flags& flags, const std::string& bin_dir, const std::string& log_dir,
                 const TlsFiles& tls, PassResult& pass) {
  const std::vector<bool> modes = tls.enabled() ? std::vector<bool>{false, true} : std::vector<bool>{false};
  for (const std::string& transport : flags.transports) {
    for (const TrellisTopology& topo : flags.topologies) {
     for (const bool with_tls : modes) {  // plain, then TLS right after: the same conditions
      const std::string name = transport + " " + topo.Name() + (with_tls ? " tls" : "");
      TrellisRunOptions options;
      if (with_tls) options.tls = tls;
      options.transport = transport;
      options.topology = topo;
      options.sizes = flags.sizes;
      options.budget = BulkBudget(flags, 1);  // MeasureTrellis scales warm-up by size itself
      options.bin_dir = bin_dir;
      options.log_dir = log_dir;
      options.slice_bytes = flags.slice_bytes;
      options.retain_pushes = flags.retain_pushes;
      StatusOr<std::vector<TrellisSizeResult>> r = MeasureTrellis(options);
      if (!r.ok()) {
        std::cerr << "trellis " << name << ": " << r.status().ToString() << "\n";
        pass.trellis_failed = true;
        continue;
      }
      pass.columns.push_back(name);
      pass.workers[name] = topo.workers;
      for (const TrellisSizeResult& s : *r) {
        pass.trellis[name][s.bytes] = s;
        std::cout << "  trellis " << name << " " << FormatBytes(s.bytes) << ": "
                  << Fixed(s.gbytes_per_s_per_worker, 2) << " GB/s per worker ("
                  << Fixed(s.gbytes_per_s_per_worker * topo.workers, 2) << " all workers), p50 " << Us(s.p50_s)
                  << " us, p99 " << Us(s.p99_s) << " us, CPU " << Fixed(s.cpu_s_per_step * 1e3, 2)
                  << " ms/step (" << s.steps << " steps)\n";
        if (s.bytes == kLatencyBytes && !with_tls && !pass.latency.count(transport)) {
          pass.latency[transport] = s;
        }
      }
     }
    }
  }
}

}  // namespace

bool IsTlsColumn(const std::string& column) {
  return column.size() > 4 && column.compare(column.size() - 4, 4, " tls") == 0;
}

std::string LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? Fixed(load[0], 2) : "unknown";
}

StatusOr<PassResult> RunPass(const Flags& flags, const std::string& condition, const std::string& bin_dir,
                             const std::string& log_dir) {
  const auto start = Clock::now();
  PassResult pass;
  pass.condition = condition;
  pass.load_average_start = LoadAverage();
  std::cout << "pass: " << condition << " (load average " << pass.load_average_start << ")\n";
  // The first echo a process measures runs cold: at 1 MiB it read 0.7 GB/s at 1.8 ms of CPU per
  // message where every later one in the same process read 2.3-3.1 GB/s at 0.6 ms (measured
  // first or after another size alike), so the baseline's first size was a cold and a warm run
  // averaged. One short echo, not reported, warms it.
  if (StatusOr<TcpEchoResult> warm = MeasureTcpEcho(1 << 20, WarmupBudget()); !warm.ok()) {
    return warm.status().Annotate("tcp echo warm-up");
  }
  // The echo again after the Trellis part; the mean of the two is the baseline, so load that
  // drifts during the pass skews the ratio less.
  TRELLIS_RETURN_IF_ERROR(TcpPass(flags, "before", pass));
  TRELLIS_RETURN_IF_ERROR(GrpcPass(flags, pass));
  const bool trellis = !flags.baselines_only && TrellisAvailable();
  if (trellis) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec) return UnavailableError("cannot create log dir " + log_dir + ": " + ec.message());
  }
  if (!flags.baselines_only && !trellis) {
    std::cout << "  trellis: not built (no worker library in this build); baselines only\n";
  }
  if (trellis) {
    TlsFiles tls;
    if (flags.tls) {
      // A job CA for the pass, and where this kernel puts the record layer (kTLS or user space).
      TRELLIS_ASSIGN_OR_RETURN(tls, BenchTlsFiles(log_dir + "/tls"));
      TRELLIS_ASSIGN_OR_RETURN(pass.tls_offload, ProbeTlsOffload(tls));
      std::cout << "  tls: mutual, TLS 1.3, data link record layer in " << pass.tls_offload << "\n";
    }
    TrellisPass(flags, bin_dir, log_dir, tls, pass);
    if (!pass.trellis.empty()) TRELLIS_RETURN_IF_ERROR(TcpPass(flags, "after ", pass));
  }
  pass.seconds = SecondsSince(start);
  return pass;
}

}  // namespace trellis::bench
