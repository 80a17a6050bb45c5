// What bench_twobit measures, shared between the CPU part (main.cc) and the GPU part (gpu.cc).
#pragma once

#include <string>
#include <vector>

#include "bench/common/stats.h"

namespace trellis::bench {

struct Row {
  std::string what;          // "quantize avx2"
  double input_gbps = 0;     // float32 bytes of the tensor per second
  double traffic_gbps = 0;   // bytes actually read + written per second
  double baseline_gbps = 0;  // memcpy of the same size, input bytes per second
};

// Per element: bytes read + written, for the traffic column.
inline constexpr double kQuantizeTraffic = 4 + 4 + 4 + 0.25;  // grad, residual in/out, codes
inline constexpr double kDequantizeTraffic = 0.25 + 4;         // codes in, floats out
inline constexpr double kDequantizeAddTraffic = 0.25 + 4 + 4;  // codes in, accumulator in/out
inline constexpr double kCopyTraffic = 4 + 4;

// GPU rows; `note` explains when there are none (no CUDA build or no device).
void RunGpu(uint64_t bytes, const Budget& budget, std::vector<Row>* rows, std::string* note);

}  // namespace trellis::bench
