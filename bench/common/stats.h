// Small measurement helpers for benchmarks: a monotonic stopwatch, latency samples with
// percentiles, and a run loop bounded both by iterations and by wall time (so a slow machine
// still finishes the bench in bounded time).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace trellis::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Latency samples in seconds.
class Samples {
 public:
  void Add(double seconds) { values_.push_back(seconds); }
  size_t count() const { return values_.size(); }
  // Nearest-rank percentile, p in [0, 100]. 0 when empty.
  double Percentile(double p) const;
  double Mean() const;

 private:
  std::vector<double> values_;
};

// How long a measurement may run: at least min_iters, at most max_iters, and it stops early
// (after min_iters) once max_seconds have passed.
struct Budget {
  int warmup_iters = 2;
  int min_iters = 3;
  int max_iters = 1000;
  double max_seconds = 1.0;
};

struct RunResult {
  int iters = 0;          // measured iterations (warm-up excluded)
  double seconds = 0;     // wall time of the measured iterations
  Samples latencies;      // one sample per measured iteration
};

// Calls `iteration` warmup_iters times unmeasured, then measured until the budget says stop.
// The first error ends the run and is returned.
StatusOr<RunResult> RunBounded(const Budget& budget, const std::function<Status()>& iteration);

// "4 KiB", "16 MiB": sizes in the binary units the tables use.
std::string FormatBytes(uint64_t bytes);
// Parses "4K", "4KiB", "1M", "64MiB", "4096" (binary units). Error names the bad text.
StatusOr<uint64_t> ParseBytes(const std::string& text);
// Parses a comma-separated list of sizes ("4K,1M,16M").
StatusOr<std::vector<uint64_t>> ParseSizeList(const std::string& text);

}  // namespace trellis::bench

namespace trellis::bench {

// CPU seconds (user + system) this process has used so far, all threads.
double ProcessCpuSeconds();
// CPU seconds (user + system) of another process so far (/proc/<pid>/stat); 0 if unreadable.
double ProcessCpuSeconds(int pid);

}  // namespace trellis::bench
