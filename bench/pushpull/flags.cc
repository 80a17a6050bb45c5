#include "bench/pushpull/flags.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "bench/common/stats.h"

namespace trellis::bench {

const char kUsage[] =
    "usage: bench_pushpull [--quick] [--sizes=4K,1M,16M,64M,256M] [--topologies=1x1,2x2]\n"
    "                      [--load[=N]] [--baselines-only] [--slice-bytes=B]\n"
    "                      [--transport=grpc,tcp,local] [--bin-dir=DIR] [--log-dir=DIR]\n"
    "                      [--retain-pushes=on|off] [--seconds=S] [--tls] [--rounds=N]\n"
    "  --quick           fewer iterations (smoke run)\n"
    "  --sizes           tensor/message sizes, binary units (K, M, G)\n"
    "  --topologies      WxS pairs: W workers (threads) x S servers (processes)\n"
    "  --load[=N]        also measure everything again under a competing CPU load: N busy\n"
    "                    processes (default one per CPU), each figure next to the TCP echo\n"
    "                    measured under the same load\n"
    "  --baselines-only  only the TCP and gRPC baselines\n"
    "  --slice-bytes     the job's sliceBytes (default: the job default, 1 MiB)\n"
    "  --transport       the workers' data paths to measure, in this run (default grpc,tcp);\n"
    "                    local: the raw protocol over the servers' local sockets (tcp: over\n"
    "                    TCP, as the echo)\n"
    "  --bin-dir         where trellis-scheduler and trellis-pserver are (default: next to this)\n"
    "  --log-dir         where the children's logs go (default: a fresh temp dir)\n"
    "  --retain-pushes   the job's recovery.retainPushes (default on; off: no copy per push)\n"
    "  --seconds         measured seconds per size and column (default 1.5, --quick 0.3);\n"
    "                    longer runs for profiling (perf record -p ...)\n"
    "  --tls             every Trellis column also with mutual TLS between all parts (right\n"
    "                    after the plain one), and a table of what TLS costs\n"
    "  --rounds          N passes per condition, alternating idle and loaded (default 1); the\n"
    "                    tables then give each ratio's median and range over the rounds\n";

namespace {

// The non-empty items of a comma-separated list.
std::vector<std::string> SplitList(const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) items.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

// "--<flag>=<text>" as a whole number in [lo, hi]; the error says what the flag wants.
StatusOr<int> ParseCount(const std::string& flag, const std::string& text, int lo, int hi,
                         const std::string& what) {
  int n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < lo || n > hi) {
    return InvalidArgumentError("--" + flag + "=" + text + ": want " + what + " in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return n;
}

}  // namespace

StatusOr<std::vector<TrellisTopology>> ParseTopologies(const std::string& text) {
  std::vector<TrellisTopology> out;
  for (const std::string& item : SplitList(text)) {
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
  std::vector<std::string> out = SplitList(text);
  for (const std::string& item : out) {
    if (item != "grpc" && item != "tcp" && item != "local") {
      return InvalidArgumentError("bad transport '" + item + "': want grpc, tcp or local");
    }
  }
  if (out.empty()) return InvalidArgumentError("empty transport list '" + text + "'");
  return out;
}

StatusOr<Flags> ParseFlags(int argc, char** argv, int cpus) {
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
    } else if (arg == "--tls") {
      flags.tls = true;
    } else if (arg == "--baselines-only") {
      flags.baselines_only = true;
    } else if (arg == "--load") {
      flags.load_processes = std::max(cpus, 1);
    } else if (auto v = value_of("load")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.load_processes,
                               ParseCount("load", *v, 1, 64, "a number of busy processes"));
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
    } else if (auto v = value_of("seconds")) {
      char* end = nullptr;
      flags.seconds_per_size = std::strtod(v->c_str(), &end);
      if (v->empty() || *end != '\0' || !(flags.seconds_per_size > 0 && flags.seconds_per_size <= 600)) {
        return InvalidArgumentError("--seconds=" + *v + ": want seconds in (0, 600]");
      }
    } else if (auto v = value_of("rounds")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.rounds, ParseCount("rounds", *v, 1, 20, "a number of rounds"));
    } else if (auto v = value_of("log-dir")) {
      flags.log_dir = *v;
    } else {
      return InvalidArgumentError("unknown flag '" + arg + "'");
    }
  }
  return flags;
}

}  // namespace trellis::bench
