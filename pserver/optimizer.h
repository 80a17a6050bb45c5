// Server-side optimizers of `update` mode, applied to the MEAN gradient of a step (sum / W), so
// W workers on their own batches equal one process on the concatenated batch. The formulas are
// the textbook ones (as in PyTorch's SGD and Adam with L2 weight decay), element by element:
//
//   SGD:   g = grad + wd*w;  v = momentum*v + g  (v starts at 0);  w -= lr * v
//          (momentum 0: plain w -= lr * g)
//   Adam:  g = grad + wd*w;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2;
//          m_hat = m / (1 - b1^t);  v_hat = v / (1 - b2^t);  w -= lr * m_hat / (sqrt(v_hat) + eps)
//          with t = 1, 2, ... the step number.
#pragma once

#include <cstdint>
#include <vector>

#include "common/job/job_spec.h"

namespace trellis {

// Optimizer state of one slice (momentum buffer, or Adam's m and v).
struct OptimizerState {
  std::vector<float> m;
  std::vector<float> v;
};

// Applies one step. `grad` is the mean gradient; `step` >= 1.
void ApplyOptimizer(const OptimizerSpec& spec, int64_t step, const float* grad, float* weights,
                    int64_t n, OptimizerState* state);

}  // namespace trellis
