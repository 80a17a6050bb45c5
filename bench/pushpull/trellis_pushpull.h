// The Trellis side of bench_pushpull: a scheduler and S parameter servers (real processes found
// next to the bench binary, on loopback), W workers as threads each with its own trellis::Worker,
// and the two measurements (goodput per tensor size, 4 KiB round-trip latency).
//
// Goodput per worker = tensor bytes * steps / seconds, where one step is one
// PushPull(key, grad, out).Wait() on every worker at once: the tensor goes up once and the sum
// comes back once, so the tensor size is counted once per direction, as in the TCP echo.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/stats.h"
#include "common/base/status.h"
#include "common/tls/tls.h"

namespace trellis::bench {

struct TrellisTopology {
  int workers = 1;
  int servers = 1;
  std::string Name() const;  // "1w x 1s"
};

struct TrellisSizeResult {
  uint64_t bytes = 0;
  double gbytes_per_s_per_worker = 0;  // mean over workers
  double p50_s = 0;                    // step round trip, worker 0
  double p99_s = 0;
  int steps = 0;
  // CPU (user + system) of the bench process and every server per step, over the measured
  // steps: what the data path costs when cores are scarce. Under --load other processes' CPU
  // is not in it.
  double cpu_s_per_step = 0;
};

struct TrellisRunOptions {
  TrellisTopology topology;
  std::vector<uint64_t> sizes;  // one key per size
  Budget budget;                // per size
  std::string bin_dir;          // where trellis-scheduler and trellis-pserver live
  std::string log_dir;          // child logs, the job file, the token
  int64_t slice_bytes = 0;      // the job's sliceBytes; 0: the job default
  std::string transport;        // the workers' data path ("grpc", "tcp", "local"); empty: the job's
  bool retain_pushes = true;    // the job's recovery.retainPushes
  TlsFiles tls;                 // enabled: mutual TLS between every part (bench workers too)
};

// True when this bench was built with the worker library (the data path exists).
bool TrellisAvailable();

// Starts the cluster, measures every size, stops the cluster. Every process it starts is ended
// before it returns, on success and on error.
StatusOr<std::vector<TrellisSizeResult>> MeasureTrellis(const TrellisRunOptions& options);

}  // namespace trellis::bench
