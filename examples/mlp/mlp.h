// A multi-layer perceptron with ReLU hidden layers and a softmax cross-entropy head, written
// for data-parallel training: each layer's parameters (weight then bias) are one contiguous
// buffer, so one layer is one Trellis key, and the backward pass reports each layer's gradient
// the moment it exists so its push can overlap the rest of the backward pass.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace trellis::mlp {

struct EvalResult {
  double loss = 0;      // mean cross-entropy
  double accuracy = 0;  // fraction in [0, 1]
};

class Mlp {
 public:
  // sizes = {input, hidden..., classes}; REQUIRES: at least two entries, all >= 1.
  explicit Mlp(std::vector<int64_t> sizes);

  int num_layers() const { return static_cast<int>(sizes_.size()) - 1; }
  int64_t in_dim(int layer) const { return sizes_[layer]; }
  int64_t out_dim(int layer) const { return sizes_[layer + 1]; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  // Elements of layer l's buffer: weight [in x out] row-major, then bias [out].
  int64_t layer_size(int layer) const { return in_dim(layer) * out_dim(layer) + out_dim(layer); }
  int64_t num_params() const;

  float* params(int layer) { return params_[layer].data(); }
  const float* params(int layer) const { return params_[layer].data(); }
  float* grads(int layer) { return grads_[layer].data(); }
  const float* grads(int layer) const { return grads_[layer].data(); }

  // He-normal weights, zero biases, from `seed`.
  void Init(uint64_t seed);

  // Forward pass over `batch` rows of `x` ([batch x input] row-major). `before_layer(l)`, when
  // set, runs right before layer l is computed (the trainer waits for l's update there).
  // Returns the logits [batch x classes], valid until the next Forward.
  const float* Forward(const float* x, int64_t batch,
                       const std::function<void(int)>& before_layer = nullptr);

  // After Forward: mean softmax cross-entropy over the batch; writes d(loss)/d(logits).
  double LossAndGradient(const int32_t* labels, int64_t batch);

  // After LossAndGradient: fills grads(l) for every layer, last layer first, and calls
  // `layer_done(l)` as soon as layer l's gradient is complete. `x` is the Forward input.
  void Backward(const float* x, int64_t batch, const std::function<void(int)>& layer_done = nullptr);

  // Loss and accuracy over a whole set, in chunks (uses the forward workspace).
  EvalResult Evaluate(const float* x, const int32_t* labels, int64_t n);

 private:
  void EnsureWorkspace(int64_t batch);

  std::vector<int64_t> sizes_;
  std::vector<std::vector<float>> params_;
  std::vector<std::vector<float>> grads_;
  // Workspace for the current batch: acts_[l] is layer l's output (acts_[L-1] = logits).
  int64_t workspace_batch_ = 0;
  std::vector<std::vector<float>> acts_;
  std::vector<float> delta_, delta_prev_;  // d(loss)/d(layer output), current and previous
  std::vector<float> transposed_;          // scratch for transposed operands
};

}  // namespace trellis::mlp
