#include "examples/mlp/gemm.h"

#include <gtest/gtest.h>

#include <vector>

#include "examples/mlp/rng.h"

namespace trellis::mlp {
namespace {

std::vector<float> Random(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(rng.Normal());
  return v;
}

// Sizes straddle the kernel's 4-row groups and its k/n blocks (64, 256).
class GemmTest : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(GemmTest, MatchesNaiveProduct) {
  const auto [m, n, k] = GetParam();
  const auto a = Random(int64_t{m} * k, 1);
  const auto b = Random(int64_t{k} * n, 2);
  auto c = Random(int64_t{m} * n, 3);  // accumulates into existing values
  std::vector<double> want(c.begin(), c.end());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j)
      for (int p = 0; p < k; ++p) want[i * n + j] += double{a[i * k + p]} * b[p * n + j];
  GemmAccumulate(m, n, k, a.data(), b.data(), c.data());
  for (int64_t i = 0; i < int64_t{m} * n; ++i) {
    ASSERT_NEAR(c[i], want[i], 1e-4 * (1 + std::abs(want[i]))) << "at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmTest,
                         ::testing::Values(std::make_tuple(1, 1, 1), std::make_tuple(4, 8, 3),
                                           std::make_tuple(7, 13, 70), std::make_tuple(5, 300, 129),
                                           std::make_tuple(64, 257, 65)));

TEST(TransposeTest, SwapsRowsAndColumns) {
  const int rows = 37, cols = 70;
  const auto in = Random(rows * cols, 4);
  std::vector<float> out(rows * cols);
  Transpose(rows, cols, in.data(), out.data());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) ASSERT_EQ(out[c * rows + r], in[r * cols + c]);
}

}  // namespace
}  // namespace trellis::mlp
