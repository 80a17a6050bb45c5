// bench_twobit: 2-bit codec throughput (one core) next to memcpy bandwidth of the same size,
// measured in the same run; on a GPU the CUDA kernels next to device-to-device cudaMemcpy.
//
//   bench_twobit [--bytes=64M] [--gpu-bytes=256M] [--seconds=1]
//
// "input GB/s" counts the float32 tensor once (what a caller hands the codec per second);
// "traffic GB/s" counts every byte read and written; ratios are of input GB/s to the memcpy of
// the same tensor timed alternately with it, fastest of the timed runs (goals: CPU quantize >= 50% of memcpy, GPU kernels >= 70% of D2D memcpy).
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "bench/twobit/measure.h"
#include "worker-lib/codec/twobit.h"
#include "worker-lib/codec/twobit_kernels.h"

namespace trellis::bench {
namespace {

constexpr double kCpuGoal = 0.5;
constexpr double kGpuGoal = 0.7;

struct Flags {
  uint64_t bytes = 64ull << 20;
  uint64_t gpu_bytes = 256ull << 20;
  double seconds = 1.0;  // per measurement
};

constexpr char kUsage[] =
    "usage: bench_twobit [--bytes=64M] [--gpu-bytes=256M] [--seconds=1]\n"
    "  --bytes      float32 tensor size for the CPU rows (binary units: K, M, G)\n"
    "  --gpu-bytes  tensor size for the GPU rows\n"
    "  --seconds    time budget per measurement (0.05..5)\n";

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value_of = [&](const char* name) -> const char* {
      const size_t len = std::strlen(name);
      return arg.compare(0, len, name) == 0 ? arg.c_str() + len : nullptr;
    };
    if (const char* v = value_of("--bytes=")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.bytes, ParseBytes(v));
    } else if (const char* v = value_of("--gpu-bytes=")) {
      TRELLIS_ASSIGN_OR_RETURN(flags.gpu_bytes, ParseBytes(v));
    } else if (const char* v = value_of("--seconds=")) {
      char* end = nullptr;
      flags.seconds = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(flags.seconds >= 0.05 && flags.seconds <= 5)) {
        return InvalidArgumentError("--seconds: want a number in [0.05, 5], got '" + std::string(v) + "'");
      }
    } else {
      return InvalidArgumentError("unknown argument '" + arg + "'");
    }
  }
  if (flags.bytes < 64 || flags.gpu_bytes < 64) return InvalidArgumentError("--bytes/--gpu-bytes: at least 64 bytes");
  return flags;
}

// Times `fn` and a memcpy of the same tensor alternately, so both see the same machine (on a
// shared machine the load changes from second to second), and keeps the fastest of each: others'
// work only ever slows a run down.
struct Timing {
  double op_s = 0;
  double memcpy_s = 0;
};
StatusOr<Timing> TimeAgainstMemcpy(const Budget& budget, const std::function<void()>& fn,
                                   const std::function<void()>& copy) {
  Samples op, base;
  TRELLIS_RETURN_IF_ERROR(RunBounded(budget, [&] {
                            Clock::time_point t0 = Clock::now();
                            copy();
                            base.Add(SecondsSince(t0));
                            t0 = Clock::now();
                            fn();
                            op.Add(SecondsSince(t0));
                            return Status::Ok();
                          }).status());
  return Timing{op.Percentile(0), base.Percentile(0)};
}

Status RunCpu(const Flags& flags, const Budget& budget, std::vector<Row>* rows) {
  const size_t n = flags.bytes / sizeof(float);
  const double bytes = static_cast<double>(n * sizeof(float));
  const float t = 0.5f;
  std::vector<float> grad(n), residual(n, 0.0f), out(n, 0.0f), copy(n, 0.0f);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, t);  // about a third of the elements send
  for (auto& g : grad) g = normal(rng);
  std::vector<uint32_t> words(TwoBitWords(n));
  std::vector<uint8_t> frame(TwoBitEncodedBytes(n));
  const auto memcpy_fn = [&] { std::memcpy(copy.data(), grad.data(), bytes); };

  auto measure = [&](const std::string& what, double traffic, const std::function<void()>& fn) -> Status {
    TRELLIS_ASSIGN_OR_RETURN(Timing timing, TimeAgainstMemcpy(budget, fn, memcpy_fn));
    const double gbps = bytes / timing.op_s / 1e9;
    rows->push_back({what, gbps, gbps * traffic / 4, bytes / timing.memcpy_s / 1e9});
    return Status::Ok();
  };

  std::vector<const twobit_internal::Kernels*> paths{&twobit_internal::ScalarKernels()};
  if (const auto* avx2 = twobit_internal::Avx2Kernels()) paths.push_back(avx2);
  for (const auto* k : paths) {
    auto* w = reinterpret_cast<uint8_t*>(words.data());
    const std::string name = k->name;
    TRELLIS_RETURN_IF_ERROR(measure("quantize " + name, kQuantizeTraffic,
                                    [&] { k->quantize(grad.data(), residual.data(), n, t, w); }));
    TRELLIS_RETURN_IF_ERROR(
        measure("dequantize " + name, kDequantizeTraffic, [&] { k->dequantize(w, n, t, out.data()); }));
    TRELLIS_RETURN_IF_ERROR(measure("dequantize-add " + name, kDequantizeAddTraffic,
                                    [&] { k->dequantize_add(w, n, t, out.data()); }));
  }
  // The public, validating frame API on the dispatched path: what the server pays per push.
  Status status;
  const std::string active(TwoBitActivePath());
  TRELLIS_RETURN_IF_ERROR(measure("TwoBitEncode (" + active + ")", kQuantizeTraffic, [&] {
    status = TwoBitEncode(grad.data(), residual.data(), n, t, frame.data(), frame.size());
  }));
  TRELLIS_RETURN_IF_ERROR(status);
  TRELLIS_RETURN_IF_ERROR(measure("TwoBitDequantizeAdd, validating (" + active + ")", kDequantizeAddTraffic,
                                  [&] { status = TwoBitDequantizeAdd(frame.data(), frame.size(), out.data(), n); }));
  return status;
}

void PrintRows(const std::vector<Row>& rows, double goal, const char* baseline) {
  Table table({"operation", "input GB/s", "traffic GB/s", std::string(baseline) + " GB/s", "ratio", "goal"});
  for (const Row& r : rows) {
    const double ratio = r.input_gbps / r.baseline_gbps;
    const bool has_goal = r.what.rfind("quantize", 0) == 0 || r.what.rfind("dequantize", 0) == 0;
    table.AddRow({r.what, Fixed(r.input_gbps, 2), Fixed(r.traffic_gbps, 2), Fixed(r.baseline_gbps, 2),
                  Fixed(ratio, 2), has_goal ? (ratio >= goal ? "ok" : "BELOW " + Fixed(goal, 2)) : ""});
  }
  table.Print(std::cout);
}

int Main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "bench_twobit: " << flags.status().message() << "\n" << kUsage;
    return 2;
  }
  Budget budget;
  budget.warmup_iters = 1;
  budget.min_iters = 3;
  budget.max_seconds = flags->seconds;

  std::cout << "## CPU, one core: " << FormatBytes(flags->bytes) << " float32, threshold 0.5, N(0, 0.5) gradients"
            << " (dispatched path: " << TwoBitActivePath() << ")\n\n";
  std::vector<Row> cpu;
  if (Status st = RunCpu(*flags, budget, &cpu); !st.ok()) {
    std::cerr << "bench_twobit: " << st.ToString() << "\n";
    return 1;
  }
  PrintRows(cpu, kCpuGoal, "memcpy");

  std::cout << "\n## GPU: " << FormatBytes(flags->gpu_bytes) << " float32\n\n";
  std::vector<Row> gpu;
  std::string note;
  RunGpu(flags->gpu_bytes, budget, &gpu, &note);
  if (!note.empty()) std::cout << note << "\n";
  if (!gpu.empty()) PrintRows(gpu, kGpuGoal, "D2D memcpy");
  return 0;
}

}  // namespace

#ifndef TRELLIS_BENCH_TWOBIT_CUDA
void RunGpu(uint64_t, const Budget&, std::vector<Row>*, std::string* note) {
  *note = "skipped: this build has no CUDA (TRELLIS_HAVE_CUDA is OFF)";
}
#endif

}  // namespace trellis::bench

int main(int argc, char** argv) { return trellis::bench::Main(argc, argv); }
