// Data-parallel training through Trellis equals single-process training on the concatenated
// batches: k steps of a small linear model (two keys, cut into several slices over two
// servers), W = 2 and 3, aggregate mode with SGD on the workers, and update mode with the
// server's SGD+momentum and Adam against the same optimizer run locally.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "tests/unit/worker-lib/local_cluster.h"

namespace trellis {
namespace {

using testing::ClusterOptions;
using testing::LocalCluster;

constexpr int kIn = 16, kOut = 4, kBatch = 8, kSteps = 5;
constexpr int kW = kIn * kOut;  // key 0: weight matrix; key 1: bias (kOut)

struct Model {
  std::vector<float> w = std::vector<float>(kW);
  std::vector<float> b = std::vector<float>(kOut);
};

struct Sample {
  std::vector<float> x, y;
};

std::vector<Sample> MakeData(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> teacher(kW);
  std::mt19937 trng(7);
  for (auto& t : teacher) t = nd(trng);
  std::vector<Sample> out(n);
  for (auto& s : out) {
    s.x.resize(kIn);
    for (auto& v : s.x) v = nd(rng);
    s.y.assign(kOut, 0.0f);
    for (int o = 0; o < kOut; ++o) {
      for (int i = 0; i < kIn; ++i) s.y[o] += teacher[o * kIn + i] * s.x[i];
      s.y[o] += 0.1f * nd(rng);
    }
  }
  return out;
}

// Mean-squared-error gradient (0.5 * mean ||Wx + b - y||^2) over samples [lo, hi).
void Gradient(const Model& m, const std::vector<Sample>& d, int lo, int hi, std::vector<float>* gw,
              std::vector<float>* gb) {
  gw->assign(kW, 0.0f);
  gb->assign(kOut, 0.0f);
  const float inv = 1.0f / static_cast<float>(hi - lo);
  for (int s = lo; s < hi; ++s) {
    for (int o = 0; o < kOut; ++o) {
      float r = m.b[o] - d[s].y[o];
      for (int i = 0; i < kIn; ++i) r += m.w[o * kIn + i] * d[s].x[i];
      for (int i = 0; i < kIn; ++i) (*gw)[o * kIn + i] += r * d[s].x[i] * inv;
      (*gb)[o] += r * inv;
    }
  }
}

// The reference optimizers (textbook formulas, float32 state like any framework's), written
// out independently of the server's code.
struct LocalOptimizer {
  OptimizerSpec spec;
  std::vector<float> m, v;
  void Step(int t, const std::vector<float>& g, std::vector<float>* w) {
    const size_t n = g.size();
    m.resize(n, 0.0f);
    v.resize(n, 0.0f);
    const float lr = static_cast<float>(spec.learningRate);
    const float wd = static_cast<float>(spec.weightDecay);
    for (size_t i = 0; i < n; ++i) {
      float gi = g[i] + wd * (*w)[i];
      if (spec.type == OptimizerType::kSgd) {
        m[i] = static_cast<float>(spec.momentum) * m[i] + gi;
        (*w)[i] -= lr * m[i];
      } else {
        const float b1 = static_cast<float>(spec.beta1), b2 = static_cast<float>(spec.beta2);
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        float mh = m[i] / static_cast<float>(1 - std::pow(spec.beta1, t));
        float vh = v[i] / static_cast<float>(1 - std::pow(spec.beta2, t));
        (*w)[i] -= lr * mh / (std::sqrt(vh) + static_cast<float>(spec.epsilon));
      }
    }
  }
};

// Within 1e-5 relative to the tensor's scale (its largest magnitude): float sums in another
// order differ in the last bits, which near-zero elements cannot hide.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5 * scale) << what << "[" << i << "] (scale " << scale << ")";
  }
}

Model Initial() {
  Model m;
  std::mt19937 rng(123);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (auto& v : m.w) v = u(rng);
  for (auto& v : m.b) v = u(rng);
  return m;
}

// Runs k steps through Trellis; returns each worker's final model.
std::vector<Model> Distributed(int workers, ServerMode mode, const OptimizerSpec& opt,
                               float worker_lr, const std::vector<Sample>& data,
                               const std::string& transport) {
  ClusterOptions o;
  o.transport = transport;
  o.servers = 2;
  o.workers = workers;
  o.slice_bytes = 40;  // 10 floats: the weight key spans 7 slices over both servers
  o.mode = mode;
  o.optimizer = opt;
  LocalCluster c;
  EXPECT_TRUE(c.Start(o).ok());
  EXPECT_TRUE(c.Declare({{.id = 0, .name = "w", .num_elements = kW},
                         {.id = 1, .name = "b", .num_elements = kOut}})
                  .ok());
  std::vector<Model> models(workers);
  Model init = Initial();
  // Rank 0's values everywhere (and on the servers, for update mode).
  for (int r = 0; r < workers; ++r) models[r] = r == 0 ? init : Model{};
  std::vector<Handle> hs;
  for (int r = 0; r < workers; ++r) {
    hs.push_back(c.workers[r]->Broadcast(0, models[r].w.data(), 0));
    hs.push_back(c.workers[r]->Broadcast(1, models[r].b.data(), 0));
  }
  for (auto& h : hs) EXPECT_TRUE(h.Wait().ok()) << h.Wait().ToString();
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<std::vector<float>> gw(workers), gb(workers);
    std::vector<std::vector<float>> rw(workers, std::vector<float>(kW));
    std::vector<std::vector<float>> rb(workers, std::vector<float>(kOut));
    hs.clear();
    for (int r = 0; r < workers; ++r) {
      int lo = (step - 1) * workers * kBatch + r * kBatch;
      Gradient(models[r], data, lo, lo + kBatch, &gw[r], &gb[r]);
      hs.push_back(c.workers[r]->PushPull(1, gb[r].data(), rb[r].data(), 0));
      hs.push_back(c.workers[r]->PushPull(0, gw[r].data(), rw[r].data(), -1));
    }
    for (auto& h : hs) EXPECT_TRUE(h.Wait().ok()) << h.Wait().ToString();
    for (int r = 0; r < workers; ++r) {
      if (mode == ServerMode::kAggregate) {  // the sum of per-worker means -> the global mean
        for (int i = 0; i < kW; ++i) models[r].w[i] -= worker_lr * rw[r][i] / workers;
        for (int i = 0; i < kOut; ++i) models[r].b[i] -= worker_lr * rb[r][i] / workers;
      } else {  // the server's new weights
        models[r].w = rw[r];
        models[r].b = rb[r];
      }
    }
  }
  return models;
}

void CheckEquivalence(int workers, ServerMode mode, OptimizerSpec opt,
                      const std::string& transport) {
  const float lr = 0.05f;
  auto data = MakeData(workers * kBatch * kSteps, 42);
  Model ref = Initial();
  LocalOptimizer ow{opt, {}, {}}, ob{opt, {}, {}};
  if (mode == ServerMode::kAggregate) {
    ow.spec.type = ob.spec.type = OptimizerType::kSgd;
    ow.spec.learningRate = ob.spec.learningRate = lr;
    ow.spec.momentum = ob.spec.momentum = 0;
    ow.spec.weightDecay = ob.spec.weightDecay = 0;
  }
  for (int step = 1; step <= kSteps; ++step) {
    std::vector<float> gw, gb;
    int lo = (step - 1) * workers * kBatch;
    Gradient(ref, data, lo, lo + workers * kBatch, &gw, &gb);  // the concatenated batch
    ow.Step(step, gw, &ref.w);
    ob.Step(step, gb, &ref.b);
  }
  auto got = Distributed(workers, mode, opt, lr, data, transport);
  for (int r = 0; r < workers; ++r) {
    SCOPED_TRACE("worker " + std::to_string(r));
    ExpectClose(got[r].w, ref.w, "w");
    ExpectClose(got[r].b, ref.b, "b");
  }
  // The model moved: the comparison is not trivially between two initial states.
  EXPECT_GT(std::fabs(ref.w[0] - Initial().w[0]) + std::fabs(ref.b[0] - Initial().b[0]), 1e-3);
}

// Every case over both transports: the bytes must not depend on how they travel.
class EquivalenceTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Transports, EquivalenceTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

TEST_P(EquivalenceTest, AggregateSgdTwoWorkers) { CheckEquivalence(2, ServerMode::kAggregate, {}, GetParam()); }
TEST_P(EquivalenceTest, AggregateSgdThreeWorkers) { CheckEquivalence(3, ServerMode::kAggregate, {}, GetParam()); }

TEST_P(EquivalenceTest, UpdateSgdMomentum) {
  OptimizerSpec o;
  o.type = OptimizerType::kSgd;
  o.learningRate = 0.05;
  o.momentum = 0.9;
  o.weightDecay = 1e-3;
  CheckEquivalence(2, ServerMode::kUpdate, o, GetParam());
  CheckEquivalence(3, ServerMode::kUpdate, o, GetParam());
}

TEST_P(EquivalenceTest, UpdateAdam) {
  OptimizerSpec o;
  o.type = OptimizerType::kAdam;
  o.learningRate = 0.01;
  CheckEquivalence(2, ServerMode::kUpdate, o, GetParam());
  CheckEquivalence(3, ServerMode::kUpdate, o, GetParam());
}

}  // namespace
}  // namespace trellis
