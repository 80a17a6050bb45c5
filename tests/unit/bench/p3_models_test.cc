// bench_p3's layer tables against the published parameter counts of the models.
#include <gtest/gtest.h>

#include "bench/p3/models.h"

namespace trellis::bench {
namespace {

TEST(P3ModelsTest, ResNet50MatchesTorchvision) {
  Model m = ResNet50();
  EXPECT_EQ(m.parameters(), 25557032);
  EXPECT_EQ(m.tensors.size(), 161u);  // 53 convolutions + 53 x 2 batch-norm + fc weight, bias
  EXPECT_EQ(m.layers(), 54);
  EXPECT_NEAR(m.compute_s(), 0.079, 0.002);
}

TEST(P3ModelsTest, Vgg19MatchesConfigurationE) {
  Model m = Vgg19();
  EXPECT_EQ(m.parameters(), 143667240);
  EXPECT_EQ(m.tensors.size(), 38u);
  EXPECT_EQ(m.tensors[32].name, "fc6.weight");
  EXPECT_EQ(m.tensors[32].elements, 25088 * 4096);
  EXPECT_NEAR(m.compute_s(), 0.376, 0.005);
}

TEST(P3ModelsTest, TransformerBase) {
  Model m = Transformer();
  // 3 x 32000 x 512 embeddings/output + 32000 bias, 6 encoder and 6 decoder layers.
  const int64_t encoder = 4 * (512 * 512 + 512) + 2 * 1024 + 512 * 2048 + 2048 + 2048 * 512 + 512;
  const int64_t decoder = 8 * (512 * 512 + 512) + 3 * 1024 + 512 * 2048 + 2048 + 2048 * 512 + 512;
  EXPECT_EQ(m.parameters(), 3 * 32000 * 512 + 32000 + 6 * encoder + 6 * decoder);
  EXPECT_EQ(m.layers(), 15);
  EXPECT_NEAR(m.compute_s(), 0.186, 0.005);
}

TEST(P3ModelsTest, LayersAreInForwardOrderAndComputeIsPositive) {
  for (const Model& m : {ResNet50(), Vgg19(), Transformer()}) {
    int last = 0;
    for (const Tensor& t : m.tensors) {
      EXPECT_GE(t.layer, last) << m.name << " " << t.name;
      last = t.layer;
    }
    for (int l = 0; l < m.layers(); ++l) {
      EXPECT_GT(m.forward_s[l], 0) << m.name << " layer " << l;
      EXPECT_DOUBLE_EQ(m.backward_s[l], 2 * m.forward_s[l]);
    }
  }
  EXPECT_FALSE(ModelByName("alexnet").ok());
}

}  // namespace
}  // namespace trellis::bench
