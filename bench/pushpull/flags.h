// bench_pushpull's command line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/pushpull/trellis_pushpull.h"
#include "common/base/status.h"

namespace trellis::bench {

struct Flags {
  bool quick = false;
  bool baselines_only = false;
  std::vector<uint64_t> sizes = {4ull << 10, 1ull << 20, 16ull << 20, 64ull << 20, 256ull << 20};
  std::vector<TrellisTopology> topologies = {{1, 1}, {2, 2}};
  std::string bin_dir;
  std::string log_dir;
  int64_t slice_bytes = 0;  // 0: the job default
  bool retain_pushes = true;  // the job's spec.recovery.retainPushes
  std::vector<std::string> transports = {"grpc", "tcp"};  // each measured in the same run
  // --load[=N]: N busy processes (default one per CPU); every figure is measured without and
  // then with them. 0: no loaded pass.
  int load_processes = 0;
  double seconds_per_size = 0;  // --seconds: measured time per size and column; 0: 1.5 (0.3 quick)
  // --tls: every Trellis column again with mutual TLS between all parts, right after the plain
  // one, and the table of what TLS costs.
  bool tls = false;
  // --rounds=N: N passes per condition (idle, loaded, idle, loaded, ...), reported as the median
  // and range of each ratio: on a shared machine one pass's ratio moves by +-0.3.
  int rounds = 1;
};

extern const char kUsage[];

StatusOr<std::vector<TrellisTopology>> ParseTopologies(const std::string& text);
StatusOr<std::vector<std::string>> ParseTransports(const std::string& text);
// `cpus` is what --load without a count means (one busy process per CPU).
StatusOr<Flags> ParseFlags(int argc, char** argv, int cpus);

}  // namespace trellis::bench
