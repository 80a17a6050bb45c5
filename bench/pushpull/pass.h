// One measurement pass of bench_pushpull: every baseline and every Trellis column under one
// condition (idle, or with the competing CPU load running), so the ratios compare like with like.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/pushpull/flags.h"
#include "bench/pushpull/grpc_echo.h"
#include "bench/pushpull/trellis_pushpull.h"
#include "common/base/status.h"

namespace trellis::bench {

inline constexpr uint64_t kLatencyBytes = 4096;

struct PassResult {
  std::string condition;         // "idle", "load: 2 busy processes"
  std::string load_average_start;  // the 1-minute load average when the pass began
  std::map<uint64_t, double> tcp;  // raw TCP echo GB/s, mean of the passes before and after
  std::map<uint64_t, double> tcp_cpu_s;  // the echo's CPU seconds per message, same mean
  LatencyResult unary;             // bare gRPC unary, 4 KiB
  std::map<uint64_t, StreamResult> stream;  // plain gRPC bidi stream, sizes >= 1 MiB
  // Trellis, keyed by "<transport> <topology>" ("tcp 2w x 2s"), in measuring order.
  std::vector<std::string> columns;
  std::map<std::string, int> workers;  // per column
  std::map<std::string, std::map<uint64_t, TrellisSizeResult>> trellis;
  std::map<std::string, TrellisSizeResult> latency;  // per transport: 4 KiB, first topology
  std::string tls_offload;  // --tls: where the record layer ran ("user space", "kTLS send+recv")
  bool trellis_failed = false;
  double seconds = 0;
};

// A column measured with TLS (--tls): "<transport> <topology> tls". No goal applies to it.
bool IsTlsColumn(const std::string& column);

// The 1-minute load average ("unknown" when unreadable).
std::string LoadAverage();

// Runs one pass. `bin_dir` holds trellis-scheduler and trellis-pserver; the children's logs go
// to `log_dir`. Progress lines go to stdout as figures arrive.
StatusOr<PassResult> RunPass(const Flags& flags, const std::string& condition, const std::string& bin_dir,
                             const std::string& log_dir);

}  // namespace trellis::bench
