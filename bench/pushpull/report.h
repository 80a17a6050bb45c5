// bench_pushpull's summary tables: one per pass, and the idle-against-loaded ratios side by side.
#pragma once

#include <ostream>
#include <vector>

#include "bench/pushpull/pass.h"

namespace trellis::bench {

// Goals (issue 17), all as the sum over workers against the raw TCP echo of the same pass.
inline constexpr double kIdleGoal = 0.9;     // idle, every size >= kGoalFrom, every topology
inline constexpr double kLoadedGoal = 0.7;   // under the competing load
inline constexpr uint64_t kGoalFrom = 1ull << 20;
inline constexpr double kLatencyGoalUs = 70;  // 4 KiB PushPull p50, idle
inline constexpr double kLatencyRatioGoal = 1.3;  // ... and at most this times bare gRPC unary

// `loaded`: the pass ran under the competing load (its goal is kLoadedGoal, no latency goal).
void PrintPass(const PassResult& pass, bool loaded, std::ostream& out);
// The ratio of every Trellis figure to its pass's echo, without and with the load.
void PrintComparison(const PassResult& idle, const PassResult& loaded, std::ostream& out);
// --rounds: each ratio's median and range over the passes of one condition (every pass ran the
// same columns and sizes); the goal is judged on the median. `loaded` as for PrintPass.
void PrintRounds(const std::vector<PassResult>& passes, bool loaded, std::ostream& out);

}  // namespace trellis::bench
