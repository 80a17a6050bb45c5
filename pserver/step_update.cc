#include "pserver/step_update.h"

namespace trellis {

Values StepUpdate::Apply(int64_t step, int32_t pushers, std::unique_ptr<std::vector<float>>* sum,
                         SliceWeights* weights) const {
  if (mode_ == ServerMode::kAggregate) return Values(std::move(*sum));
  std::vector<float>& g = **sum;
  const float inv = 1.0f / static_cast<float>(pushers);
  for (float& x : g) x *= inv;
  ApplyOptimizer(optimizer_, weights->step_base + step, g.data(), weights->values.data(),
                 static_cast<int64_t>(g.size()), &weights->opt);
  return std::make_shared<const std::vector<float>>(weights->values);
}

}  // namespace trellis
