#include "examples/mlp/dataset.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "examples/mlp/rng.h"

namespace trellis::mlp {
namespace {

void FillNormal(Rng& rng, float* out, int64_t n, double stddev) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(rng.Normal() * stddev);
}

// x = P z + 0.1 * noise with z ~ N(0, I_latent), P a fixed random [input x latent] map with
// unit-variance outputs; or x ~ N(0, I) when latent_dim is 0.
void DrawInput(const TaskOptions& options, const std::vector<float>& projection, Rng& rng, float* x) {
  const int64_t in = options.input_dim, lat = options.latent_dim;
  if (lat == 0) {
    FillNormal(rng, x, in, 1.0);
    return;
  }
  float z[256];
  FillNormal(rng, z, lat, 1.0);
  for (int64_t i = 0; i < in; ++i) {
    float s = static_cast<float>(rng.Normal() * 0.1);
    for (int64_t j = 0; j < lat; ++j) s += projection[i * lat + j] * z[j];
    x[i] = s;
  }
}

Dataset MakeSet(const TaskOptions& options, int64_t size, uint64_t stream, double label_noise) {
  Teacher teacher(options);
  Dataset set;
  set.size = size;
  set.dim = options.input_dim;
  set.x.resize(size * options.input_dim);
  set.y.resize(size);
  Rng rng(MixSeed(options.seed, stream));
  Rng noise(MixSeed(options.seed, stream + 100));
  std::vector<float> logits(options.classes);
  for (int64_t i = 0; i < size; ++i) {
    float* x = set.x.data() + i * options.input_dim;
    // Bounded, so an unreachable margin degrades to "no margin" instead of hanging.
    for (int attempt = 0; attempt < 1000; ++attempt) {
      DrawInput(options, teacher.projection(), rng, x);
      teacher.Logits(x, logits.data());
      std::partial_sort(logits.begin(), logits.begin() + 2, logits.end(), std::greater<float>());
      if (logits[0] - logits[1] >= options.min_margin) break;
    }
    set.y[i] = teacher.Label(x);
    if (label_noise > 0 && noise.Uniform() < label_noise) {
      set.y[i] = static_cast<int32_t>(noise.Below(options.classes));
    }
  }
  return set;
}

}  // namespace

Teacher::Teacher(const TaskOptions& options) : options_(options) {
  const int64_t in = options.input_dim, hid = options.teacher_hidden, cls = options.classes;
  Rng rng(MixSeed(options.seed, 0));
  if (options.latent_dim > 0) {
    projection_.resize(in * options.latent_dim);
    FillNormal(rng, projection_.data(), in * options.latent_dim,
               1.0 / std::sqrt(static_cast<double>(options.latent_dim)));
  }
  const int64_t w2_in = hid == 0 ? in : hid;  // a linear teacher maps the input directly
  w1_.resize(hid * in);
  b1_.resize(hid);
  w2_.resize(cls * w2_in);
  b2_.assign(cls, 0.0f);
  FillNormal(rng, w1_.data(), hid * in, 1.0 / std::sqrt(static_cast<double>(in)));
  FillNormal(rng, b1_.data(), hid, 0.5);
  FillNormal(rng, w2_.data(), cls * w2_in, 1.0 / std::sqrt(static_cast<double>(w2_in)));

  // Calibrate the output biases on a separate sample so the classes come out roughly
  // balanced: each round lowers the bias of over-represented classes and raises rare ones.
  // Logits are computed once without the bias; steps shrink over the rounds (large steps
  // make whole classes flip between empty and dominant).
  constexpr int64_t kCalibration = 4096;
  constexpr int kRounds = 300;
  std::vector<float> x(in);
  std::vector<float> raw(kCalibration * cls);
  Rng calib(MixSeed(options.seed, 3));
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < kCalibration; ++i) {
    DrawInput(options, projection_, calib, x.data());
    Logits(x.data(), raw.data() + i * cls);  // b2_ is still zero here
    for (int64_t c = 0; c < cls; ++c) {
      sum += raw[i * cls + c];
      sum_sq += double{raw[i * cls + c]} * raw[i * cls + c];
    }
  }
  const double n = static_cast<double>(kCalibration * cls);
  const double spread = std::sqrt(std::max(sum_sq / n - (sum / n) * (sum / n), 1e-12));
  const double expected = static_cast<double>(kCalibration) / static_cast<double>(cls);
  for (int round = 0; round < kRounds; ++round) {
    std::vector<int64_t> count(cls, 0);
    for (int64_t i = 0; i < kCalibration; ++i) {
      const float* z = raw.data() + i * cls;
      int64_t best = 0;
      for (int64_t c = 1; c < cls; ++c) {
        if (z[c] + b2_[c] > z[best] + b2_[best]) best = c;
      }
      ++count[best];
    }
    const double step = 0.3 * spread / (1.0 + round / 10.0);
    for (int64_t c = 0; c < cls; ++c) {
      const double ratio = std::log((static_cast<double>(count[c]) + 1.0) / (expected + 1.0));
      b2_[c] -= static_cast<float>(step * std::clamp(ratio, -1.0, 1.0));
    }
  }
}

void Teacher::Logits(const float* x, float* out) const {
  const int64_t in = options_.input_dim, hid = options_.teacher_hidden, cls = options_.classes;
  if (hid == 0) {  // linear teacher: w2 is [classes x input]
    for (int64_t c = 0; c < cls; ++c) {
      float s = b2_[c];
      for (int64_t i = 0; i < in; ++i) s += w2_[c * in + i] * x[i];
      out[c] = s;
    }
    return;
  }
  std::vector<float> h(hid);
  for (int64_t j = 0; j < hid; ++j) {
    float s = b1_[j];
    for (int64_t i = 0; i < in; ++i) s += w1_[j * in + i] * x[i];
    h[j] = std::max(s, 0.0f);
  }
  for (int64_t c = 0; c < cls; ++c) {
    float s = b2_[c];
    for (int64_t j = 0; j < hid; ++j) s += w2_[c * hid + j] * h[j];
    out[c] = s;
  }
}

int32_t Teacher::Label(const float* x) const {
  std::vector<float> logits(options_.classes);
  Logits(x, logits.data());
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Dataset MakeTrainSet(const TaskOptions& options, int64_t size) {
  return MakeSet(options, size, 1, options.label_noise);
}

Dataset MakeTestSet(const TaskOptions& options, int64_t size) {
  return MakeSet(options, size, 2, 0.0);
}

Dataset Shard(const Dataset& full, int rank, int world) {
  Dataset shard;
  shard.dim = full.dim;
  shard.size = world > 0 ? full.size / world : 0;
  const int64_t begin = static_cast<int64_t>(rank) * shard.size;
  shard.x.assign(full.x.begin() + begin * full.dim, full.x.begin() + (begin + shard.size) * full.dim);
  shard.y.assign(full.y.begin() + begin, full.y.begin() + begin + shard.size);
  return shard;
}

}  // namespace trellis::mlp
