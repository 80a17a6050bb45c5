// trellis-bench-fc: the worker of bench/twobit/e2e.sh. A model made of big fully connected
// layers, trained for a number of steps with simulated compute (a sleep per layer, so the
// figure does not depend on how busy this machine's cores are): per step the backward pass goes
// from the last layer to the first, starting each layer's PushPull as soon as its gradient is
// ready (priority = -layer, so the first layer's slices go first), and the next forward pass
// waits for each layer's sum in order. Rank 0 prints the step rate of the timed steps and the
// bytes it pushed and pulled (all steps, on the wire):
//   RESULT: steps_per_s 1.234 pushed_bytes 123 pulled_bytes 456 steps 10 params 16777216
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "trellis/trellis.h"

namespace {

struct Flags {
  std::vector<int64_t> layers = {4096 * 2048, 4096 * 2048};  // elements per layer
  int warmup = 2;          // untimed steps (connections, first-touch, compression warm-up)
  int steps = 8;           // timed steps
  double compute_ms = 20;  // simulated compute per layer, forward + backward
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      std::string prefix = std::string(name) + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("--layers")) {  // comma-separated element counts
      f->layers.clear();
      for (const char* p = v; *p != '\0';) {
        char* end = nullptr;
        long long n = std::strtoll(p, &end, 10);
        if (end == p || n < 1) return false;
        f->layers.push_back(n);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (const char* v = value("--warmup")) {
      f->warmup = std::atoi(v);
    } else if (const char* v = value("--steps")) {
      f->steps = std::atoi(v);
    } else if (const char* v = value("--compute-ms")) {
      f->compute_ms = std::atof(v);
    } else {
      return false;
    }
  }
  return !f->layers.empty() && f->steps > 0 && f->warmup >= 0 && f->compute_ms >= 0;
}

void Compute(double ms) {
  std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (!ParseFlags(argc, argv, &f)) {
    std::fprintf(stderr, "usage: trellis-bench-fc [--layers=N,N,...] [--warmup=2] [--steps=8] "
                         "[--compute-ms=20]\n");
    return 2;
  }
  auto w = trellis::Worker::Create();
  if (!w.ok()) {
    std::fprintf(stderr, "trellis-bench-fc: %s\n", w.status().ToString().c_str());
    return 3;
  }
  trellis::Worker& worker = **w;
  const int n = static_cast<int>(f.layers.size());
  int64_t params = 0;
  std::vector<std::vector<float>> grad(n), sum(n);
  std::mt19937 rng(1234 + worker.rank());
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (int l = 0; l < n; ++l) {
    params += f.layers[l];
    grad[l].resize(f.layers[l]);
    for (auto& v : grad[l]) v = nd(rng);
    sum[l].assign(f.layers[l], 0.0f);
    trellis::Status st = worker.DeclareKey(
        {.id = static_cast<trellis::KeyId>(l), .name = "fc" + std::to_string(l),
         .num_elements = f.layers[l]});
    if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 4;
  }
  if (auto st = worker.FinishDeclarations(); !st.ok()) {
    return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 4;
  }
  std::vector<trellis::Handle> h(n);
  const double per_layer = f.compute_ms / n;
  std::chrono::steady_clock::time_point t0;
  for (int step = 0; step < f.warmup + f.steps; ++step) {
    if (step == f.warmup) t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < n; ++l) {  // forward: needs each layer's previous sum
      if (auto st = h[l].Wait(); !st.ok()) {
        return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 5;
      }
      Compute(per_layer / 3);
    }
    for (int l = n - 1; l >= 0; --l) {  // backward: gradient of layer l, then its exchange
      Compute(per_layer * 2 / 3);
      h[l] = worker.PushPull(l, grad[l].data(), sum[l].data(), -l);
    }
  }
  for (int l = 0; l < n; ++l) {
    if (auto st = h[l].Wait(); !st.ok()) {
      return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 5;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (worker.rank() == 0) {
    std::printf("RESULT: steps_per_s %.4f pushed_bytes %llu pulled_bytes %llu steps %d "
                "params %lld\n",
                f.steps / s, static_cast<unsigned long long>(worker.bytes_pushed()),
                static_cast<unsigned long long>(worker.bytes_pulled()), f.steps,
                static_cast<long long>(params));
  }
  return 0;
}
