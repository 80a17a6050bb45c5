// bench_twobit: 2-bit codec throughput (one core) next to memcpy bandwidth of the same size,
// measured in the same run; on a GPU the CUDA kernels next to device-to-device cudaMemcpy.
//
//   bench_twobit [--bytes=64M] [--gpu-bytes=256M] [--seconds=1]
//
// "input GB/s" counts the float32 tensor once (what a caller hands the codec per second);
// "traffic GB/s" counts every byte read and written. "ratio" compares input GB/s with a memcpy
// of the same tensor (CPU: timed in the same iterations, per 1 MiB chunk, fastest of each kept); "traffic ratio"
// compares bytes moved, i.e. the fraction of memory bandwidth reached. Goals: CPU quantize
// >= 50% of memcpy (input ratio); GPU kernels >= 70% of D2D memcpy bandwidth (traffic ratio;
// quantize moves 3x its input, so its input ratio cannot pass 0.65).
#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "bench/twobit/measure.h"
#include "datapath/codec/twobit.h"
#include "datapath/codec/twobit_kernels.h"

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

// The tensor is processed in 1 MiB chunks (slice-sized pieces, like the data path) and every
// chunk is timed on its own; a row's time is the sum over chunks of each chunk's fastest time.
// On a busy shared machine a whole 64 MiB pass is almost always preempted somewhere, which
// would penalize the slower (longer) operations most; a 1 MiB chunk usually runs through.
constexpr size_t kChunkElements = (1u << 20) / sizeof(float);  // a multiple of 16

// Per-chunk minimum times.
class ChunkTimes {
 public:
  explicit ChunkTimes(size_t chunks) : best_(chunks, 1e30) {}
  void Add(size_t chunk, double seconds) { best_[chunk] = std::min(best_[chunk], seconds); }
  double Total() const {
    double sum = 0;
    for (double s : best_) sum += s;
    return sum;
  }

 private:
  std::vector<double> best_;
};

struct Timing {
  double op_s = 0;
  double memcpy_s = 0;
};

// Times fn(first, count) and a memcpy over the whole tensor, chunk by chunk, a pass of each per
// iteration, so both see the same machine.
StatusOr<Timing> TimeAgainstMemcpy(const Budget& budget, size_t n,
                                   const std::function<void(size_t, size_t)>& fn,
                                   const std::function<void(size_t, size_t)>& copy) {
  const size_t chunks = (n + kChunkElements - 1) / kChunkElements;
  ChunkTimes op(chunks), base(chunks);
  auto pass = [&](const std::function<void(size_t, size_t)>& f, ChunkTimes& times) {
    for (size_t c = 0; c < chunks; ++c) {
      const size_t first = c * kChunkElements;
      const size_t count = std::min(kChunkElements, n - first);
      const Clock::time_point t0 = Clock::now();
      f(first, count);
      times.Add(c, SecondsSince(t0));
    }
  };
  TRELLIS_RETURN_IF_ERROR(RunBounded(budget, [&] {
                            pass(copy, base);
                            pass(fn, op);
                            return Status::Ok();
                          }).status());
  return Timing{op.Total(), base.Total()};
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
  // One frame per chunk, as the data path sends one per slice.
  const size_t frame_stride = TwoBitEncodedBytes(kChunkElements);
  std::vector<uint8_t> frames(frame_stride * ((n + kChunkElements - 1) / kChunkElements));
  auto* w = reinterpret_cast<uint8_t*>(words.data());
  const auto memcpy_fn = [&](size_t first, size_t count) {
    std::memcpy(copy.data() + first, grad.data() + first, count * sizeof(float));
  };

  auto measure = [&](const std::string& what, double traffic,
                     const std::function<void(size_t, size_t)>& fn) -> Status {
    TRELLIS_ASSIGN_OR_RETURN(Timing timing, TimeAgainstMemcpy(budget, n, fn, memcpy_fn));
    const double gbps = bytes / timing.op_s / 1e9;
    rows->push_back({what, gbps, gbps * traffic / 4, bytes / timing.memcpy_s / 1e9});
    return Status::Ok();
  };

  std::vector<const twobit_internal::Kernels*> paths{&twobit_internal::ScalarKernels()};
  if (const auto* avx2 = twobit_internal::Avx2Kernels()) paths.push_back(avx2);
  for (const auto* k : paths) {
    const std::string name = k->name;
    // first is a multiple of 16: the chunk's words start at word first / 16.
    TRELLIS_RETURN_IF_ERROR(measure("quantize " + name, kQuantizeTraffic, [&](size_t first, size_t count) {
      k->quantize(grad.data() + first, residual.data() + first, count, t, w + first / 4);
    }));
    TRELLIS_RETURN_IF_ERROR(measure("dequantize " + name, kDequantizeTraffic, [&](size_t first, size_t count) {
      k->dequantize(w + first / 4, count, t, out.data() + first);
    }));
    TRELLIS_RETURN_IF_ERROR(measure("dequantize-add " + name, kDequantizeAddTraffic, [&](size_t first, size_t count) {
      k->dequantize_add(w + first / 4, count, t, out.data() + first);
    }));
  }
  // The public, validating frame API on the dispatched path: what a worker and the server pay
  // per slice.
  Status status;
  const std::string active(TwoBitActivePath());
  auto frame_of = [&](size_t first) { return frames.data() + first / kChunkElements * frame_stride; };
  TRELLIS_RETURN_IF_ERROR(measure("TwoBitEncode (" + active + ")", kQuantizeTraffic, [&](size_t first, size_t count) {
    Status st = TwoBitEncode(grad.data() + first, residual.data() + first, count, t, frame_of(first),
                             TwoBitEncodedBytes(count));
    if (!st.ok()) status = st;
  }));
  TRELLIS_RETURN_IF_ERROR(status);
  TRELLIS_RETURN_IF_ERROR(measure("TwoBitDequantizeAdd, validating (" + active + ")", kDequantizeAddTraffic,
                                  [&](size_t first, size_t count) {
                                    Status st = TwoBitDequantizeAdd(frame_of(first), TwoBitEncodedBytes(count),
                                                                    out.data() + first, count);
                                    if (!st.ok()) status = st;
                                  }));
  return status;
}

// ratio: input GB/s over the memcpy's; traffic ratio: bytes moved per second over the memcpy's
// (how close to the memory bandwidth). The goal applies to one of them (`goal_on_traffic`).
void PrintRows(const std::vector<Row>& rows, double goal, bool goal_on_traffic, const char* baseline) {
  Table table({"operation", "input GB/s", "traffic GB/s", std::string(baseline) + " GB/s", "ratio",
               "traffic ratio", goal_on_traffic ? "goal (traffic)" : "goal (input)"});
  for (const Row& r : rows) {
    const double ratio = r.input_gbps / r.baseline_gbps;
    const double traffic_ratio = r.traffic_gbps / (r.baseline_gbps * kCopyTraffic / 4);
    const double judged = goal_on_traffic ? traffic_ratio : ratio;
    const bool has_goal = r.what.rfind("quantize", 0) == 0 || r.what.rfind("dequantize", 0) == 0;
    table.AddRow({r.what, Fixed(r.input_gbps, 2), Fixed(r.traffic_gbps, 2), Fixed(r.baseline_gbps, 2),
                  Fixed(ratio, 2), Fixed(traffic_ratio, 2),
                  has_goal ? (judged >= goal ? "ok" : "BELOW " + Fixed(goal, 2)) : ""});
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
  PrintRows(cpu, kCpuGoal, /*goal_on_traffic=*/false, "memcpy");

  std::cout << "\n## GPU: " << FormatBytes(flags->gpu_bytes) << " float32\n\n";
  std::vector<Row> gpu;
  std::string note;
  RunGpu(flags->gpu_bytes, budget, &gpu, &note);
  if (!note.empty()) std::cout << note << "\n";
  if (!gpu.empty()) PrintRows(gpu, kGpuGoal, /*goal_on_traffic=*/true, "D2D memcpy");
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
