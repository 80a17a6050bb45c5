// bench_pushpull: Trellis PushPull goodput and latency next to physical baselines measured in
// the same run. See docs/performance.md for how to read the table.
//
//   bench_pushpull [--quick] [--sizes=4K,1M,16M,64M] [--topologies=1x1,2x2] [--baselines-only]
//                  [--slice-bytes=B] [--transport=grpc,tcp] [--bin-dir=DIR] [--log-dir=DIR]
//                  [--retain-pushes=on|off]
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "bench/pushpull/grpc_echo.h"
#include "bench/pushpull/tcp_echo.h"
#include "bench/pushpull/trellis_pushpull.h"
#include "common/logging.h"

namespace trellis::bench {
namespace {

constexpr uint64_t kLatencyBytes = 4096;
// Goals the data path is held to (DESIGN: bulk near the wire; small calls near bare gRPC).
constexpr double kGoodputGoal = 0.75;      // of raw TCP echo, for tensors >= 16 MiB
constexpr uint64_t kGoodputGoalFrom = 16ull << 20;
constexpr double kLatencyGoal = 1.3;       // 4 KiB p50 at most 1.3x bare gRPC unary

struct Flags {
  bool quick = false;
  bool baselines_only = false;
  std::vector<uint64_t> sizes = {4ull << 10, 1ull << 20, 16ull << 20, 64ull << 20};
  std::vector<TrellisTopology> topologies = {{1, 1}, {2, 2}};
  std::string bin_dir;
  std::string log_dir;
  int64_t slice_bytes = 0;  // 0: the job default
  bool retain_pushes = true;  // the job's spec.recovery.retainPushes
  std::vector<std::string> transports = {"grpc", "tcp"};  // each measured in the same run
};

constexpr char kUsage[] =
    "usage: bench_pushpull [--quick] [--sizes=4K,1M,16M,64M] [--topologies=1x1,2x2]\n"
    "                      [--baselines-only] [--slice-bytes=B] [--transport=grpc,tcp]\n"
    "                      [--bin-dir=DIR] [--log-dir=DIR] [--retain-pushes=on|off]\n"
    "  --quick           fewer iterations (smoke run, a few seconds)\n"
    "  --sizes           tensor/message sizes, binary units (K, M, G)\n"
    "  --topologies      WxS pairs: W workers (threads) x S servers (processes)\n"
    "  --baselines-only  only the TCP and gRPC baselines\n"
    "  --slice-bytes     the job's sliceBytes (default: the job default, 4 MiB)\n"
    "  --transport       the workers' data paths to measure, in this run (default grpc,tcp)\n"
    "  --bin-dir         where trellis-scheduler and trellis-pserver are (default: next to this)\n"
    "  --log-dir         where the children's logs go (default: a fresh temp dir)\n"
    "  --retain-pushes   the job's recovery.retainPushes (default on; off: no copy per push)\n";

StatusOr<std::vector<TrellisTopology>> ParseTopologies(const std::string& text) {
  std::vector<TrellisTopology> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    int w = 0, s = 0;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%dx%d%c", &w, &s, &tail) != 2 || w < 1 || s < 1 || w > 16 || s > 16) {
      return InvalidArgumentError("bad topology '" + item + "': expected WxS with 1..16 each, e.g. 2x2");
    }
    out.push_back({w, s});
  }
  if (out.empty()) return InvalidArgumentError("empty topology list '" + text + "'");
  return out;
}

StatusOr<std::vector<std::string>> ParseTransports(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    if (item != "grpc" && item != "tcp") {
      return InvalidArgumentError("bad transport '" + item + "': want grpc or tcp");
    }
    out.push_back(item);
  }
  if (out.empty()) return InvalidArgumentError("empty transport list '" + text + "'");
  return out;
}

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value_of = [&](const std::string& name) -> std::optional<std::string> {
      const std::string prefix = "--" + name + "=";
      if (arg.rfind(prefix, 0) == 0) return arg.substr(prefix.size());
      return std::nullopt;
    };
    if (arg == "--quick") {
      flags.quick = true;
    } else if (arg == "--baselines-only") {
      flags.baselines_only = true;
    } else if (auto v = value_of("sizes")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.sizes, ParseSizeList(*v));
    } else if (auto v = value_of("topologies")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.topologies, ParseTopologies(*v));
    } else if (auto v = value_of("bin-dir")) {
      flags.bin_dir = *v;
    } else if (auto v = value_of("slice-bytes")) {
      TRELLIS_ASSIGN_OR_RETURN(uint64_t b, ParseBytes(*v));
      flags.slice_bytes = static_cast<int64_t>(b);
    } else if (auto v = value_of("transport")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.transports, ParseTransports(*v));
    } else if (auto v = value_of("retain-pushes")) {
      if (*v != "on" && *v != "off") return InvalidArgumentError("--retain-pushes: on or off");
      flags.retain_pushes = *v == "on";
    } else if (auto v = value_of("log-dir")) {
      flags.log_dir = *v;
    } else {
      return InvalidArgumentError("unknown flag '" + arg + "'");
    }
  }
  return flags;
}

// Bulk budgets are in seconds per size so the whole bench stays bounded whatever the machine.
Budget BulkBudget(const Flags& f, uint64_t bytes) {
  Budget b;
  b.warmup_iters = bytes >= (16ull << 20) ? 1 : 20;
  b.min_iters = 3;
  b.max_iters = 1000000;
  b.max_seconds = f.quick ? 0.3 : 1.5;
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

// The 1-minute load average: on a shared machine it says how much the figures can be trusted.
std::string LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? Fixed(load[0], 2) : "unknown";
}

std::string Us(double seconds) { return Fixed(seconds * 1e6, 0); }
std::string Ratio(double num, double den) { return den > 0 ? Fixed(num / den, 2) : "-"; }

int Run(const Flags& flags) {
  const auto bench_start = Clock::now();
  std::cout << "bench_pushpull: " << (flags.quick ? "quick" : "full") << " run, "
            << std::thread::hardware_concurrency() << " CPUs, loopback, load average "
            << LoadAverage() << "\n";

  // (a) raw TCP echo. Measured again after the Trellis part; the mean of the two passes is the
  // baseline, so load that drifts during the run (a shared machine) skews the ratio less.
  std::map<uint64_t, double> tcp;  // GB/s, mean of the passes
  auto tcp_pass = [&](const char* label) -> bool {
    for (uint64_t size : flags.sizes) {
      StatusOr<TcpEchoResult> r = MeasureTcpEcho(size, BulkBudget(flags, size));
      if (!r.ok()) {
        std::cerr << "tcp echo " << FormatBytes(size) << ": " << r.status().ToString() << "\n";
        return false;
      }
      tcp[size] = tcp.count(size) ? (tcp[size] + r->gbytes_per_s) / 2 : r->gbytes_per_s;
      std::cout << "  tcp echo " << label << " " << FormatBytes(size) << ": " << Fixed(r->gbytes_per_s, 2)
                << " GB/s (" << r->messages << " msgs, SO_SNDBUF " << r->socket_buffer_bytes << ")\n";
    }
    return true;
  };
  if (!tcp_pass("before")) return 1;

  // (b) and (c): the gRPC echo service.
  StatusOr<std::unique_ptr<GrpcEchoServer>> server = GrpcEchoServer::Start();
  if (!server.ok()) {
    std::cerr << server.status().ToString() << "\n";
    return 1;
  }
  StatusOr<LatencyResult> unary = MeasureGrpcUnary((*server)->address(), kLatencyBytes, LatencyBudget(flags));
  if (!unary.ok()) {
    std::cerr << "grpc unary: " << unary.status().ToString() << "\n";
    return 1;
  }
  std::cout << "  grpc unary    4 KiB: p50 " << Us(unary->p50_s) << " us, p99 " << Us(unary->p99_s)
            << " us (" << unary->calls << " calls)\n";
  std::map<uint64_t, StreamResult> stream;
  for (uint64_t size : flags.sizes) {
    if (size < (1ull << 20)) continue;  // context figure for bulk sizes only
    StatusOr<StreamResult> r = MeasureGrpcStream((*server)->address(), size, BulkBudget(flags, size));
    if (!r.ok()) {
      std::cerr << "grpc stream " << FormatBytes(size) << ": " << r.status().ToString() << "\n";
      return 1;
    }
    stream[size] = *r;
    std::cout << "  grpc stream   " << FormatBytes(size) << ": " << Fixed(r->gbytes_per_s, 2) << " GB/s ("
              << r->messages << " msgs)\n";
  }
  server->reset();

  // (2) Trellis.
  // Keyed by "<transport> <topology>", e.g. "tcp 2w x 2s".
  std::map<std::string, std::map<uint64_t, TrellisSizeResult>> trellis;
  std::map<std::string, TrellisSizeResult> trellis_latency;  // per transport: 4 KiB, first topology
  std::vector<std::string> columns;  // the Trellis runs in order
  bool trellis_failed = false;
  if (!flags.baselines_only && !TrellisAvailable()) {
    std::cout << "  trellis: not built (no worker library in this build); baselines only\n";
  } else if (!flags.baselines_only) {
    std::string bin_dir = flags.bin_dir;
    if (bin_dir.empty()) {
      std::error_code ec;
      bin_dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
      if (ec) {
        std::cerr << "cannot read /proc/self/exe: " << ec.message() << "\n";
        return 1;
      }
    }
    std::string log_dir = flags.log_dir;
    if (log_dir.empty()) {
      char tmpl[] = "/tmp/bench_pushpull.XXXXXX";
      if (mkdtemp(tmpl) == nullptr) {
        std::cerr << "mkdtemp: " << std::strerror(errno) << "\n";
        return 1;
      }
      log_dir = tmpl;
    }
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    if (ec) {
      std::cerr << "cannot create log dir " << log_dir << ": " << ec.message() << "\n";
      return 1;
    }
    std::cout << "  trellis: binaries from " << bin_dir << ", logs in " << log_dir << "\n";
    for (const std::string& transport : flags.transports) {
      for (const TrellisTopology& topo : flags.topologies) {
        const std::string name = transport + " " + topo.Name();
        TrellisRunOptions options;
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
          trellis_failed = true;
          continue;
        }
        columns.push_back(name);
        for (const TrellisSizeResult& s : *r) {
          trellis[name][s.bytes] = s;
          std::cout << "  trellis " << name << " " << FormatBytes(s.bytes) << ": "
                    << Fixed(s.gbytes_per_s_per_worker, 2) << " GB/s per worker ("
                    << Fixed(s.gbytes_per_s_per_worker * topo.workers, 2) << " all workers), p50 " << Us(s.p50_s)
                    << " us, p99 " << Us(s.p99_s) << " us (" << s.steps << " steps)\n";
          if (s.bytes == kLatencyBytes && !trellis_latency.count(transport)) {
            trellis_latency[transport] = s;
          }
        }
      }
    }
  }

  if (!trellis.empty() && !tcp_pass("after ")) return 1;

  // Summary tables.
  std::cout << "\nGoodput (GB/s = 1e9 bytes/s; message or tensor size counted once per direction, "
               "per worker):\n\n";
  std::vector<std::string> header = {"size", trellis.empty() ? "TCP echo" : "TCP echo (mean of 2)",
                                     "gRPC stream"};
  for (const std::string& name : columns) {
    header.push_back("Trellis " + name);
    header.push_back("/ TCP");
  }
  header.push_back("goal");
  Table goodput(header);
  for (uint64_t size : flags.sizes) {
    std::vector<std::string> row = {FormatBytes(size), Fixed(tcp[size], 2),
                                    stream.count(size) ? Fixed(stream[size].gbytes_per_s, 2) : "-"};
    // Per transport: met when every topology of that transport reaches the goal.
    std::map<std::string, bool> meets;
    for (const std::string& name : columns) {
      auto it = trellis[name].find(size);
      const double g = it == trellis[name].end() ? 0 : it->second.gbytes_per_s_per_worker;
      row.push_back(it == trellis[name].end() ? "-" : Fixed(g, 2));
      row.push_back(Ratio(g, tcp[size]));
      const std::string transport = name.substr(0, name.find(' '));
      bool ok = g >= kGoodputGoal * tcp[size];
      meets[transport] = meets.count(transport) ? meets[transport] && ok : ok;
    }
    if (size < kGoodputGoalFrom) {
      row.push_back("-");
    } else {
      std::string goal = ">= 0.75";
      for (const auto& [transport, ok] : meets) goal += " " + transport + (ok ? " met" : " MISSED");
      row.push_back(goal);
    }
    goodput.AddRow(row);
  }
  goodput.Print(std::cout);

  std::cout << "\n4 KiB round trip (microseconds):\n\n";
  Table latency({"", "p50", "p99", "p50 / gRPC unary", "goal"});
  latency.AddRow({"bare gRPC unary", Us(unary->p50_s), Us(unary->p99_s), "1.00", ""});
  for (const auto& [transport, lat] : trellis_latency) {
    const double ratio = lat.p50_s / unary->p50_s;
    latency.AddRow({"Trellis PushPull " + transport + " " + flags.topologies.front().Name(),
                    Us(lat.p50_s), Us(lat.p99_s), Fixed(ratio, 2),
                    std::string("<= 1.30 ") + (ratio <= kLatencyGoal ? "met" : "MISSED")});
  }
  latency.Print(std::cout);
  std::cout << "\ntotal bench time " << Fixed(SecondsSince(bench_start), 1) << " s, load average "
            << LoadAverage() << "\n";
  return trellis_failed ? 1 : 0;
}

}  // namespace
}  // namespace trellis::bench

int main(int argc, char** argv) {
  trellis::SetLogTag("bench_pushpull");
  trellis::SetLogLevel(trellis::LogLevel::kWarning);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << trellis::bench::kUsage;
      return 0;
    }
  }
  trellis::StatusOr<trellis::bench::Flags> flags = trellis::bench::ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "bench_pushpull: " << flags.status().message() << "\n" << trellis::bench::kUsage;
    return 2;
  }
  return trellis::bench::Run(*flags);
}
