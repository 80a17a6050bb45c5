#include "pserver/optimizer.h"

#include <cmath>

namespace trellis {

void ApplyOptimizer(const OptimizerSpec& spec, int64_t step, const float* grad, float* w,
                    int64_t n, OptimizerState* state) {
  const float lr = static_cast<float>(spec.learningRate);
  const float wd = static_cast<float>(spec.weightDecay);
  if (spec.type == OptimizerType::kSgd) {
    if (spec.momentum == 0.0) {
      for (int64_t i = 0; i < n; ++i) w[i] -= lr * (grad[i] + wd * w[i]);
      return;
    }
    const float mu = static_cast<float>(spec.momentum);
    if (state->m.size() != static_cast<size_t>(n)) state->m.assign(n, 0.0f);
    float* v = state->m.data();
    for (int64_t i = 0; i < n; ++i) {
      float g = grad[i] + wd * w[i];
      v[i] = mu * v[i] + g;
      w[i] -= lr * v[i];
    }
    return;
  }
  // Adam
  if (state->m.size() != static_cast<size_t>(n)) state->m.assign(n, 0.0f);
  if (state->v.size() != static_cast<size_t>(n)) state->v.assign(n, 0.0f);
  const float b1 = static_cast<float>(spec.beta1);
  const float b2 = static_cast<float>(spec.beta2);
  const float eps = static_cast<float>(spec.epsilon);
  const float c1 = static_cast<float>(1.0 - std::pow(spec.beta1, static_cast<double>(step)));
  const float c2 = static_cast<float>(1.0 - std::pow(spec.beta2, static_cast<double>(step)));
  float* m = state->m.data();
  float* v = state->v.data();
  for (int64_t i = 0; i < n; ++i) {
    float g = grad[i] + wd * w[i];
    m[i] = b1 * m[i] + (1.0f - b1) * g;
    v[i] = b2 * v[i] + (1.0f - b2) * g * g;
    float mh = m[i] / c1;
    float vh = v[i] / c2;
    w[i] -= lr * mh / (std::sqrt(vh) + eps);
  }
}

}  // namespace trellis
