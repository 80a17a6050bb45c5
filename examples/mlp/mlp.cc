#include "examples/mlp/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "examples/mlp/gemm.h"
#include "examples/mlp/rng.h"

namespace trellis::mlp {

Mlp::Mlp(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {
  params_.resize(num_layers());
  grads_.resize(num_layers());
  for (int l = 0; l < num_layers(); ++l) {
    params_[l].assign(layer_size(l), 0.0f);
    grads_[l].assign(layer_size(l), 0.0f);
  }
}

int64_t Mlp::num_params() const {
  int64_t total = 0;
  for (int l = 0; l < num_layers(); ++l) total += layer_size(l);
  return total;
}

void Mlp::Init(uint64_t seed) {
  for (int l = 0; l < num_layers(); ++l) {
    Rng rng(MixSeed(seed, 1000 + l));
    const double stddev = std::sqrt(2.0 / static_cast<double>(in_dim(l)));
    float* p = params(l);
    const int64_t weights = in_dim(l) * out_dim(l);
    for (int64_t i = 0; i < weights; ++i) p[i] = static_cast<float>(rng.Normal() * stddev);
    std::fill(p + weights, p + layer_size(l), 0.0f);
  }
}

void Mlp::EnsureWorkspace(int64_t batch) {
  if (batch <= workspace_batch_) return;
  workspace_batch_ = batch;
  acts_.resize(num_layers());
  int64_t widest = 0;
  for (int l = 0; l < num_layers(); ++l) {
    acts_[l].assign(batch * out_dim(l), 0.0f);
    widest = std::max({widest, in_dim(l), out_dim(l)});
  }
  delta_.assign(batch * widest, 0.0f);
  delta_prev_.assign(batch * widest, 0.0f);
  int64_t largest = batch * widest;
  for (int l = 0; l < num_layers(); ++l) largest = std::max(largest, in_dim(l) * out_dim(l));
  transposed_.assign(largest, 0.0f);
}

const float* Mlp::Forward(const float* x, int64_t batch, const std::function<void(int)>& before_layer) {
  EnsureWorkspace(batch);
  const float* in = x;
  for (int l = 0; l < num_layers(); ++l) {
    if (before_layer) before_layer(l);
    const int64_t n_in = in_dim(l);
    const int64_t n_out = out_dim(l);
    const float* w = params(l);
    const float* b = w + n_in * n_out;
    float* out = acts_[l].data();
    for (int64_t r = 0; r < batch; ++r) std::memcpy(out + r * n_out, b, n_out * sizeof(float));
    GemmAccumulate(batch, n_out, n_in, in, w, out);
    if (l + 1 < num_layers()) {
      for (int64_t i = 0; i < batch * n_out; ++i) out[i] = std::max(out[i], 0.0f);
    }
    in = out;
  }
  return acts_[num_layers() - 1].data();
}

double Mlp::LossAndGradient(const int32_t* labels, int64_t batch) {
  const int64_t classes = sizes_.back();
  const float* logits = acts_[num_layers() - 1].data();
  double loss = 0;
  const float scale = 1.0f / static_cast<float>(batch);
  for (int64_t r = 0; r < batch; ++r) {
    const float* z = logits + r * classes;
    float* d = delta_.data() + r * classes;
    const float zmax = *std::max_element(z, z + classes);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<double>(z[c] - zmax));
    const double log_sum = std::log(sum);
    const int32_t y = labels[r];
    loss += log_sum - static_cast<double>(z[y] - zmax);
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(static_cast<double>(z[c] - zmax) - log_sum);
      d[c] = static_cast<float>(p - (c == y ? 1.0 : 0.0)) * scale;
    }
  }
  return loss / static_cast<double>(batch);
}

void Mlp::Backward(const float* x, int64_t batch, const std::function<void(int)>& layer_done) {
  for (int l = num_layers() - 1; l >= 0; --l) {
    const int64_t n_in = in_dim(l);
    const int64_t n_out = out_dim(l);
    const float* in = l == 0 ? x : acts_[l - 1].data();
    float* gw = grads(l);
    float* gb = gw + n_in * n_out;
    // dW = in^T * delta: transposing the input first keeps the kernel's inner loop contiguous.
    Transpose(batch, n_in, in, transposed_.data());
    std::fill(gw, gw + n_in * n_out, 0.0f);
    GemmAccumulate(n_in, n_out, batch, transposed_.data(), delta_.data(), gw);
    std::fill(gb, gb + n_out, 0.0f);
    for (int64_t r = 0; r < batch; ++r) {
      const float* d = delta_.data() + r * n_out;
      for (int64_t c = 0; c < n_out; ++c) gb[c] += d[c];
    }
    if (layer_done) layer_done(l);
    if (l == 0) break;
    // d(in) = delta * W^T, then through the ReLU that produced `in`.
    Transpose(n_in, n_out, params(l), transposed_.data());
    std::fill(delta_prev_.begin(), delta_prev_.begin() + batch * n_in, 0.0f);
    GemmAccumulate(batch, n_in, n_out, delta_.data(), transposed_.data(), delta_prev_.data());
    for (int64_t i = 0; i < batch * n_in; ++i) {
      if (in[i] <= 0.0f) delta_prev_[i] = 0.0f;
    }
    std::swap(delta_, delta_prev_);
  }
}

EvalResult Mlp::Evaluate(const float* x, const int32_t* labels, int64_t n) {
  constexpr int64_t kChunk = 256;
  const int64_t classes = sizes_.back();
  double loss = 0;
  int64_t correct = 0;
  for (int64_t start = 0; start < n; start += kChunk) {
    const int64_t len = std::min(kChunk, n - start);
    const float* logits = Forward(x + start * sizes_[0], len);
    for (int64_t r = 0; r < len; ++r) {
      const float* z = logits + r * classes;
      const int64_t pred = std::max_element(z, z + classes) - z;
      if (pred == labels[start + r]) ++correct;
    }
    loss += LossAndGradient(labels + start, len) * static_cast<double>(len);
  }
  EvalResult result;
  if (n > 0) {
    result.loss = loss / static_cast<double>(n);
    result.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  return result;
}

}  // namespace trellis::mlp
