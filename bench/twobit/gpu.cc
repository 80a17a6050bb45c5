// The GPU half of bench_twobit: CUDA kernels timed with events over a batch of launches, next to
// a device-to-device cudaMemcpy of the same tensor.
#include <cuda_runtime_api.h>

#include <random>
#include <string>
#include <vector>

#include "bench/twobit/measure.h"
#include "datapath/codec/twobit.h"
#include "worker-lib/cuda/twobit_cuda.h"

namespace trellis::bench {
namespace {

constexpr int kLaunchesPerSample = 10;  // amortizes launch and event overhead

// Owns a device allocation.
struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

Status Cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return InternalError(std::string(what) + ": " + cudaGetErrorString(err));
}

// Seconds per launch of `launch` in the fastest batch (event-timed), as the CPU rows.
StatusOr<double> TimeLaunches(const Budget& budget, const std::function<Status()>& launch) {
  cudaEvent_t start, stop;
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventCreate(&start), "cudaEventCreate"));
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventCreate(&stop), "cudaEventCreate"));
  Samples samples;
  auto result = RunBounded(budget, [&]() -> Status {
    TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventRecord(start), "cudaEventRecord"));
    for (int i = 0; i < kLaunchesPerSample; ++i) TRELLIS_RETURN_IF_ERROR(launch());
    TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventRecord(stop), "cudaEventRecord"));
    TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventSynchronize(stop), "cudaEventSynchronize"));
    float ms = 0;
    TRELLIS_RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime"));
    samples.Add(ms / 1e3 / kLaunchesPerSample);
    return Status::Ok();
  });
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!result.ok()) return result.status();
  return samples.Percentile(0);
}

Status Run(uint64_t bytes_flag, const Budget& budget, std::vector<Row>* rows, std::string* note) {
  const size_t n = bytes_flag / sizeof(float);
  const double bytes = static_cast<double>(n * sizeof(float));
  const float t = 0.5f;
  DeviceBuffer grad(n * 4), residual(n * 4), out(n * 4), copy(n * 4), words(TwoBitWords(n) * 4);
  if (!grad.p || !residual.p || !out.p || !copy.p || !words.p) return InternalError("cudaMalloc failed");
  std::vector<float> host(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, t);
  for (auto& g : host) g = normal(rng);
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaMemcpy(grad.p, host.data(), bytes, cudaMemcpyHostToDevice), "upload"));
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaMemset(residual.p, 0, bytes), "cudaMemset"));
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaMemset(out.p, 0, bytes), "cudaMemset"));

  auto* g = static_cast<const float*>(grad.p);
  auto* r = static_cast<float*>(residual.p);
  auto* o = static_cast<float*>(out.p);
  auto* w = static_cast<uint32_t*>(words.p);
  TRELLIS_ASSIGN_OR_RETURN(double copy_s, TimeLaunches(budget, [&] {
                             return Cuda(cudaMemcpyAsync(copy.p, grad.p, bytes, cudaMemcpyDeviceToDevice),
                                         "cudaMemcpyAsync");
                           }));
  const double memcpy_gbps = bytes / copy_s / 1e9;
  rows->push_back({"D2D cudaMemcpy", memcpy_gbps, memcpy_gbps * kCopyTraffic / 4, memcpy_gbps});
  auto add = [&](const char* what, double seconds, double traffic) {
    const double gbps = bytes / seconds / 1e9;
    rows->push_back({what, gbps, gbps * traffic / 4, memcpy_gbps});
  };
  TRELLIS_ASSIGN_OR_RETURN(double q, TimeLaunches(budget, [&] { return TwoBitQuantizeCuda(g, r, n, t, w); }));
  add("quantize cuda", q, kQuantizeTraffic);
  TRELLIS_ASSIGN_OR_RETURN(double d, TimeLaunches(budget, [&] { return TwoBitDequantizeCuda(w, n, t, o); }));
  add("dequantize cuda", d, kDequantizeTraffic);
  TRELLIS_ASSIGN_OR_RETURN(double da, TimeLaunches(budget, [&] { return TwoBitDequantizeAddCuda(w, n, t, o); }));
  add("dequantize-add cuda", da, kDequantizeAddTraffic);
  TRELLIS_RETURN_IF_ERROR(Cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));

  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) *note = std::string("device 0: ") + prop.name;
  return Status::Ok();
}

}  // namespace

void RunGpu(uint64_t bytes, const Budget& budget, std::vector<Row>* rows, std::string* note) {
  if (CudaDeviceCount() == 0) {
    *note = "skipped: no CUDA device on this machine";
    return;
  }
  if (Status st = Run(bytes, budget, rows, note); !st.ok()) {
    rows->clear();
    *note = "GPU rows failed: " + st.ToString();
  }
}

}  // namespace trellis::bench
