// 2-bit compression end to end: workers with `compression: 2bit` against in-process parameter
// servers over each transport. The sums the servers return must equal, bit for bit, a plain
// scalar reference of the algorithm applied per slice per worker (residual += gradient; send
// +-t or 0; residual -= sent, bounded to [-t, t]), with the warm-up steps full precision, priority slicing on, and
// in update mode the server's optimizer applied to the dequantized sum; in aggregate mode the
// compressed steps' answers come back packed (spec.compression.packedPulls) and decode to the
// same bits.
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "pserver/optimizer.h"
#include "tests/unit/worker-lib/local_cluster.h"
#include "datapath/codec/packed_sum.h"
#include "datapath/codec/twobit.h"

namespace trellis {
namespace {

using testing::ClusterOptions;
using testing::LocalCluster;

constexpr float kThreshold = 0.5f;
constexpr int64_t kSliceBytes = 256;  // 64 floats: keys below span several slices

// The reference: what one worker sends for one slice, written without the codec.
struct RefSlice {
  std::vector<float> residual;
  // Returns the decoded values the server adds for `grad` and updates the residual.
  std::vector<float> Send(const float* grad, size_t n) {
    residual.resize(n, 0.0f);
    std::vector<float> sent(n);
    for (size_t i = 0; i < n; ++i) {
      const float r = residual[i] + grad[i];
      const float d = r >= kThreshold ? kThreshold : (r <= -kThreshold ? -kThreshold : 0.0f);
      const float rest = r - d;
      residual[i] = rest < -kThreshold ? -kThreshold : (rest > kThreshold ? kThreshold : rest);
      sent[i] = d;
    }
    return sent;
  }
};

struct RefKey {
  int64_t n;
  std::vector<RefSlice> slices;  // per worker x slice, [w * num_slices + s]
};

class TwoBitDatapathTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Transports, TwoBitDatapathTest, ::testing::Values("grpc", "tcp"),
                         [](const auto& info) { return info.param; });

std::vector<float> Gradient(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> nd(0.0f, 0.4f);
  std::vector<float> g(n);
  for (auto& v : g) v = nd(rng);
  return g;
}

// Runs `steps` PushPulls of every key on every worker and checks each answer against the
// reference. Update mode: the reference applies the same optimizer to the reference sum.
void RunAndCheck(LocalCluster& c, const ClusterOptions& o, const std::vector<int64_t>& sizes,
                 int steps) {
  const int w = o.workers;
  const int64_t per_slice = kSliceBytes / 4;
  std::vector<RefKey> ref(sizes.size());
  std::vector<std::vector<float>> weights(sizes.size());
  std::vector<OptimizerState> opt(sizes.size());
  std::vector<KeyDecl> decls;
  for (size_t k = 0; k < sizes.size(); ++k) {
    ref[k].n = sizes[k];
    ref[k].slices.resize(w * ((sizes[k] + per_slice - 1) / per_slice));
    decls.push_back({.id = k, .name = "k" + std::to_string(k), .num_elements = sizes[k]});
  }
  ASSERT_TRUE(c.Declare(decls).ok());
  if (o.mode == ServerMode::kUpdate) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      weights[k].assign(sizes[k], 0.25f);
      std::vector<Handle> hs;
      std::vector<std::vector<float>> bufs(w, weights[k]);
      for (int i = 0; i < w; ++i) hs.push_back(c.workers[i]->Broadcast(k, bufs[i].data(), 0));
      for (auto& h : hs) ASSERT_TRUE(h.Wait().ok()) << h.Wait().ToString();
    }
  }
  std::mt19937 rng(11);
  for (int step = 1; step <= steps; ++step) {
    const bool compressed = step > o.compression.warmupSteps;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      const int64_t nslices = (n + per_slice - 1) / per_slice;
      std::vector<std::vector<float>> grads, outs(w, std::vector<float>(n, -7.0f));
      for (int i = 0; i < w; ++i) grads.push_back(Gradient(rng, n));
      std::vector<Handle> hs;
      for (int i = 0; i < w; ++i) {
        // Different priorities per key: slices of later keys overtake (priority slicing).
        hs.push_back(c.workers[i]->PushPull(k, grads[i].data(), outs[i].data(),
                                            static_cast<int>(k)));
      }
      for (auto& h : hs) ASSERT_TRUE(h.Wait().ok()) << h.Wait().ToString();
      // The reference sum: worker 0's contribution, then the others' added in rank order
      // (values are 0 or +-t, so the order of additions does not change the bits for W <= 3).
      std::vector<float> want(n, 0.0f);
      for (int i = 0; i < w; ++i) {
        for (int64_t s = 0; s < nslices; ++s) {
          const int64_t lo = s * per_slice, len = std::min(per_slice, n - lo);
          std::vector<float> sent(grads[i].begin() + lo, grads[i].begin() + lo + len);
          if (compressed) sent = ref[k].slices[i * nslices + s].Send(grads[i].data() + lo, len);
          for (int64_t j = 0; j < len; ++j) {
            want[lo + j] = i == 0 ? sent[j] : want[lo + j] + sent[j];
          }
        }
      }
      if (o.mode == ServerMode::kUpdate) {
        const float inv = 1.0f / static_cast<float>(w);
        for (auto& v : want) v *= inv;
        ApplyOptimizer(o.optimizer, step, want.data(), weights[k].data(), n, &opt[k]);
        want = weights[k];
      }
      for (int i = 0; i < w; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(outs[i][j], want[j]) << "step " << step << " key " << k << " worker " << i
                                         << " element " << j << (compressed ? " (2bit)" : "");
        }
      }
    }
  }
}

// Wire bytes of one worker's pushes: warm-up steps as float32, then one frame per slice.
uint64_t ExpectedPushBytes(const std::vector<int64_t>& sizes, int steps, int warmup) {
  const int64_t per_slice = kSliceBytes / 4;
  uint64_t full = 0, packed = 0;
  for (int64_t n : sizes) {
    full += 4 * n;
    for (int64_t lo = 0; lo < n; lo += per_slice) {
      packed += TwoBitEncodedBytes(std::min(per_slice, n - lo));
    }
  }
  return full * warmup + packed * (steps - warmup);
}

// Wire bytes of one step's packed answers of `bits` per element: one per slice.
uint64_t ExpectedPackedBytes(const std::vector<int64_t>& sizes, int bits) {
  const int64_t per_slice = kSliceBytes / 4;
  uint64_t bytes = 0;
  for (int64_t n : sizes) {
    for (int64_t lo = 0; lo < n; lo += per_slice) {
      bytes += PackedSumBytes(static_cast<size_t>(std::min(per_slice, n - lo)), bits);
    }
  }
  return bytes;
}

// The value of the first series of `name` in Prometheus text format, or -1.
double MetricValue(const std::string& text, const std::string& name) {
  for (size_t at = text.find(name); at != std::string::npos; at = text.find(name, at + 1)) {
    const char after = text[at + name.size()];
    if ((at != 0 && text[at - 1] != '\n') || (after != '{' && after != ' ')) continue;
    const size_t end = text.find('\n', at);
    const size_t sp = text.rfind(' ', end);
    return std::stod(text.substr(sp + 1, end - sp - 1));
  }
  return -1;
}

TEST_P(TwoBitDatapathTest, AggregateSumsEqualTheScalarReferenceBitForBit) {
  ClusterOptions o;
  o.transport = GetParam();
  o.servers = 2;
  o.workers = 2;
  o.slice_bytes = kSliceBytes;
  o.water_mark = 3;  // few slots: the queue orders slices by priority
  o.compression = {CompressionType::kTwoBit, kThreshold, /*warmupSteps=*/2};
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  const std::vector<int64_t> sizes = {1000, 37, 64, 129};
  const int steps = 7;
  RunAndCheck(c, o, sizes, steps);
  for (size_t i = 0; i < c.workers.size(); ++i) {
    auto& wk = c.workers[i];
    EXPECT_EQ(wk->bytes_pushed(), ExpectedPushBytes(sizes, steps, 2));
    const CompressionStats cs = wk->compression_stats();
    EXPECT_EQ(cs.bytes_in, 4u * (1000 + 37 + 64 + 129) * (steps - 2));
    EXPECT_EQ(cs.bytes_out, ExpectedPushBytes(sizes, steps - 2, 0));
    EXPECT_GT(cs.nanoseconds, 0u);
    // The same figures in the worker's metrics.
    const std::string text = c.worker_metrics[i]->Serialize();
    EXPECT_EQ(MetricValue(text, "trellis_worker_compression_input_bytes_total"),
              static_cast<double>(cs.bytes_in)) << text;
    EXPECT_EQ(MetricValue(text, "trellis_worker_compression_output_bytes_total"),
              static_cast<double>(cs.bytes_out));
    // One observation per compressed PushPull.
    EXPECT_EQ(MetricValue(text, "trellis_worker_compression_seconds_count"),
              static_cast<double>(sizes.size() * (steps - 2)));
    // The compressed steps came back packed (packedPulls defaults to true; W = 2: 4 bits), the
    // warm-up steps as float32; bytes_pulled counts what came over the wire.
    EXPECT_EQ(cs.pulled_unpacked_bytes, cs.bytes_in);
    EXPECT_EQ(cs.pulled_packed_bytes, ExpectedPackedBytes(sizes, 4) * (steps - 2));
    EXPECT_EQ(wk->bytes_pulled(), cs.pulled_packed_bytes + 4u * (1000 + 37 + 64 + 129) * 2);
    EXPECT_EQ(MetricValue(text, "trellis_worker_compression_pulled_unpacked_bytes_total"),
              static_cast<double>(cs.pulled_unpacked_bytes));
    EXPECT_EQ(MetricValue(text, "trellis_worker_compression_pulled_packed_bytes_total"),
              static_cast<double>(cs.pulled_packed_bytes));
  }
}

// The same pushes with packedPulls off and on: every answer equals the same reference bit for
// bit either way (RunAndCheck), and the packed answers take 4 bits per element instead of 32.
TEST_P(TwoBitDatapathTest, PackedAnswersGiveTheFloat32AnswersValuesInFewerBytes) {
  const std::vector<int64_t> sizes = {1000, 37, 64, 129};
  const int steps = 4;
  uint64_t pulled[2] = {0, 0};
  for (bool packed : {false, true}) {
    ClusterOptions o;
    o.transport = GetParam();
    o.servers = 2;
    o.workers = 3;
    o.slice_bytes = kSliceBytes;
    o.compression = {CompressionType::kTwoBit, kThreshold, 0};
    o.compression.packedPulls = packed;
    LocalCluster c;
    ASSERT_TRUE(c.Start(o).ok());
    RunAndCheck(c, o, sizes, steps);
    const CompressionStats cs = c.workers[0]->compression_stats();
    pulled[packed] = c.workers[0]->bytes_pulled();
    EXPECT_EQ(cs.pulled_packed_bytes, packed ? pulled[packed] : 0u);
    EXPECT_EQ(cs.pulled_unpacked_bytes, packed ? cs.bytes_in : 0u);
  }
  EXPECT_EQ(pulled[0], 4u * (1000 + 37 + 64 + 129) * steps);
  EXPECT_EQ(pulled[1], ExpectedPackedBytes(sizes, 4) * steps);
  // 64-element slices: 32 bytes of counts and a 16-byte header instead of 256 bytes.
  EXPECT_GT(pulled[0], 5 * pulled[1]);
}

TEST_P(TwoBitDatapathTest, ThreeWorkersNoWarmup) {
  ClusterOptions o;
  o.transport = GetParam();
  o.servers = 1;
  o.workers = 3;
  o.slice_bytes = kSliceBytes;
  o.compression = {CompressionType::kTwoBit, kThreshold, 0};
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  RunAndCheck(c, o, {200, 16}, 5);
}

TEST_P(TwoBitDatapathTest, UpdateModeAppliesTheOptimizerToTheDequantizedSum) {
  ClusterOptions o;
  o.transport = GetParam();
  o.servers = 2;
  o.workers = 2;
  o.slice_bytes = kSliceBytes;
  o.mode = ServerMode::kUpdate;
  o.optimizer.type = OptimizerType::kSgd;
  o.optimizer.learningRate = 0.1;
  o.optimizer.momentum = 0.9;
  o.compression = {CompressionType::kTwoBit, kThreshold, 1};
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  RunAndCheck(c, o, {300, 5}, 5);
}

TEST_P(TwoBitDatapathTest, KeysThatOptOutStayFullPrecision) {
  ClusterOptions o;
  o.transport = GetParam();
  o.workers = 2;
  o.compression = {CompressionType::kTwoBit, kThreshold, 0};
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  KeyDecl stats{.id = 9, .name = "stats", .num_elements = 3};
  stats.allow_compression = false;
  ASSERT_TRUE(c.Declare({stats}).ok());
  std::vector<float> a = {1.25f, 1e6f, 3}, b = {0.125f, 7, -3}, oa(3), ob(3);
  auto ha = c.workers[0]->PushPull(9, a.data(), oa.data());
  auto hb = c.workers[1]->PushPull(9, b.data(), ob.data());
  ASSERT_TRUE(ha.Wait().ok() && hb.Wait().ok()) << ha.Wait().ToString() << hb.Wait().ToString();
  EXPECT_EQ(oa, (std::vector<float>{1.375f, 1e6f + 7, 0}));
  EXPECT_EQ(ob, oa);
  EXPECT_EQ(c.workers[0]->compression_stats().bytes_out, 0u);
}

// Push, then Pull: the pull of a compressed step accepts a packed answer as well.
TEST_P(TwoBitDatapathTest, PullAfterACompressedPushComesBackPacked) {
  ClusterOptions o;
  o.transport = GetParam();
  o.workers = 2;
  o.slice_bytes = kSliceBytes;
  o.compression = {CompressionType::kTwoBit, kThreshold, 0};
  LocalCluster c;
  ASSERT_TRUE(c.Start(o).ok());
  ASSERT_TRUE(c.Declare({{.id = 3, .name = "w", .num_elements = 100}}).ok());
  std::vector<float> a(100), b(100), oa(100, -1), ob(100, -1), want(100);
  const auto sent = [](float g) {  // zero residual: the first step sends +-t or 0
    return g >= kThreshold ? kThreshold : (g <= -kThreshold ? -kThreshold : 0.0f);
  };
  for (int i = 0; i < 100; ++i) {
    a[i] = static_cast<float>(i % 5) * 0.3f - 0.6f;  // -0.6 .. 0.6: codes 10, 00, 11
    b[i] = static_cast<float>(i % 3) * 0.5f - 0.5f;  // -0.5, 0, 0.5
    want[i] = sent(a[i]) + sent(b[i]);
  }
  auto pa = c.workers[0]->Push(3, a.data());
  auto pb = c.workers[1]->Push(3, b.data());
  ASSERT_TRUE(pa.Wait().ok() && pb.Wait().ok()) << pa.Wait().ToString() << pb.Wait().ToString();
  auto qa = c.workers[0]->Pull(3, oa.data());
  auto qb = c.workers[1]->Pull(3, ob.data());
  ASSERT_TRUE(qa.Wait().ok() && qb.Wait().ok()) << qa.Wait().ToString() << qb.Wait().ToString();
  EXPECT_EQ(oa, want);
  EXPECT_EQ(ob, want);
  EXPECT_EQ(c.workers[0]->compression_stats().pulled_packed_bytes,
            ExpectedPackedBytes({100}, 4));
}

TEST(TwoBitWorkerSetup, BadThresholdIsRefusedAtCreate) {
  ClusterOptions o;
  o.compression = {CompressionType::kTwoBit, 0.0, 0};
  LocalCluster c;
  Status st = c.Start(o);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("threshold"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace trellis
