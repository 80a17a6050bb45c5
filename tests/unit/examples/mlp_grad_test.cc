// The backward pass against central finite differences of the loss, for every parameter of a
// small network with the same structure as the demo (ReLU hidden layers, softmax head).
#include <gtest/gtest.h>

#include <vector>

#include "examples/mlp/mlp.h"
#include "examples/mlp/rng.h"

namespace trellis::mlp {
namespace {

TEST(MlpGradientTest, BackwardMatchesFiniteDifferences) {
  Mlp model({6, 9, 7, 4});
  model.Init(42);
  // Non-zero biases so every parameter kind is exercised away from zero.
  Rng rng(5);
  for (int l = 0; l < model.num_layers(); ++l) {
    float* b = model.params(l) + model.in_dim(l) * model.out_dim(l);
    for (int64_t j = 0; j < model.out_dim(l); ++j) b[j] = static_cast<float>(0.1 * rng.Normal());
  }
  const int64_t batch = 5;
  std::vector<float> x(batch * 6);
  for (auto& v : x) v = static_cast<float>(rng.Normal());
  const std::vector<int32_t> y = {0, 3, 1, 2, 3};

  model.Forward(x.data(), batch);
  model.LossAndGradient(y.data(), batch);
  std::vector<int> done_order;
  model.Backward(x.data(), batch, [&](int l) { done_order.push_back(l); });
  EXPECT_EQ(done_order, (std::vector<int>{2, 1, 0}));  // last layer's gradient is ready first

  auto loss_at = [&]() {
    model.Forward(x.data(), batch);
    return model.LossAndGradient(y.data(), batch);
  };
  const double base = loss_at();
  int checked = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    const std::vector<float> analytic(model.grads(l), model.grads(l) + model.layer_size(l));
    for (int64_t i = 0; i < model.layer_size(l); ++i) {
      float* p = model.params(l) + i;
      const float saved = *p;
      const float eps = 1e-3f;
      *p = saved + eps;
      const double up = loss_at();
      *p = saved - eps;
      const double down = loss_at();
      *p = saved;
      // A ReLU switching inside [p-eps, p+eps] makes the two one-sided slopes disagree; the
      // derivative is undefined there, so such points are skipped (and counted below).
      const double right = (up - base) / eps, left = (base - down) / eps;
      if (std::abs(right - left) > 1e-2 * (1 + std::abs(right))) continue;
      const double numeric = (up - down) / (2.0 * eps);
      EXPECT_NEAR(analytic[i], numeric, 5e-4 + 1e-2 * std::abs(numeric))
          << "layer " << l << " param " << i;
      ++checked;
    }
  }
  // Kinks are rare: nearly every parameter must have been compared.
  EXPECT_GE(checked, model.num_params() * 9 / 10);
}

TEST(MlpGradientTest, DemoShapeHasOverAMillionParameters) {
  Mlp model({64, 1024, 768, 256, 10});
  EXPECT_GE(model.num_params(), 1'000'000);
  EXPECT_EQ(model.layer_size(0), 64 * 1024 + 1024);
}

TEST(MlpGradientTest, EvaluateCountsArgmaxMatches) {
  Mlp model({2, 3});
  // Weights [in x out] = identity-like: class = argmax of (x0, x1, 0).
  float* p = model.params(0);
  std::fill(p, p + model.layer_size(0), 0.0f);
  p[0 * 3 + 0] = 1;
  p[1 * 3 + 1] = 1;
  const std::vector<float> x = {2, 1, 1, 3, -1, -2};
  const std::vector<int32_t> y = {0, 1, 0};  // the last one is class 2 by the model
  const EvalResult r = model.Evaluate(x.data(), y.data(), 3);
  EXPECT_NEAR(r.accuracy, 2.0 / 3.0, 1e-9);
  EXPECT_GT(r.loss, 0);
}

}  // namespace
}  // namespace trellis::mlp
