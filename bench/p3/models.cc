// Layer tables of the simulated models.
//
// Shapes are the published architectures, one key per parameter tensor as a framework declares
// them (weights, biases, batch-norm and layer-norm scales and shifts):
//   ResNet-50 (He et al. 2016, torchvision resnet50): 161 tensors, 25,557,032 parameters.
//   VGG-19 (Simonyan & Zisserman 2015, configuration E): 38 tensors, 143,667,240 parameters;
//     fc6 alone is 25088x4096 = 102.8M.
//   Transformer: Sockeye's transformer-base (Vaswani et al. 2017): 6 encoder + 6 decoder layers,
//     d_model 512, feed-forward 2048, separate 32k source and target vocabularies, untied output
//     layer: about 93M parameters, 256 tensors.
//
// Compute times come from each layer's multiply-adds (convolutions: k*k*cin*cout per output
// pixel at the real feature-map sizes; fully connected and attention projections: in*out per
// sample or token), for a batch of 32 images (CNNs) or 4096 tokens (2048 source + 2048 target),
// backward costing twice the forward, on a V100-class GPU in fp32: 10 TFLOP/s sustained for the
// CNNs (cuDNN convolutions run near the 15.7 TFLOP/s peak) and 4 TFLOP/s for the transformer
// (softmax, layer norm, dropout and attention are memory-bound; this matches the 10-15k
// tokens/s reported for transformer-base in fp32 on one V100). That gives 79 ms (ResNet-50),
// 376 ms (VGG-19) and 186 ms (transformer) of compute per step, close to published single-GPU
// fp32 step times of these models. Layers without multiply-adds (embedding lookups) get a
// nominal 0.1% of the step.
#include "bench/p3/models.h"

#include <utility>

namespace trellis::bench {
namespace {

constexpr double kCnnFlopPerSecond = 10e12;
constexpr double kTransformerFlopPerSecond = 4e12;

class Builder {
 public:
  Builder(std::string name, double flop_per_second) : flop_per_second_(flop_per_second) {
    model_.name = std::move(name);
  }
  // One layer: `macs` multiply-adds for the whole batch, and its tensors.
  void Layer(double macs, std::vector<std::pair<std::string, int64_t>> tensors) {
    const int layer = model_.layers();
    for (auto& [n, e] : tensors) model_.tensors.push_back({std::move(n), e, layer});
    const double forward = 2 * macs / flop_per_second_;
    model_.forward_s.push_back(forward);
    model_.backward_s.push_back(2 * forward);
  }
  Model Done() {
    // Layers with no arithmetic still take a moment (a kernel launch, a lookup).
    const double floor = model_.compute_s() * 1e-3 / 3;
    for (int l = 0; l < model_.layers(); ++l) {
      if (model_.forward_s[l] < floor) {
        model_.forward_s[l] = floor;
        model_.backward_s[l] = 2 * floor;
      }
    }
    return std::move(model_);
  }

 private:
  const double flop_per_second_;
  Model model_;
};

// conv k x k, cin -> cout at an output of hw x hw pixels, batch 32, no bias (followed by BN).
void ConvBn(Builder& b, const std::string& name, const std::string& bn, int k, int64_t cin,
            int64_t cout, int64_t hw) {
  b.Layer(32.0 * k * k * cin * cout * hw * hw,
          {{name + ".weight", k * k * cin * cout}, {bn + ".weight", cout}, {bn + ".bias", cout}});
}

}  // namespace

int64_t Model::parameters() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.elements;
  return n;
}

double Model::compute_s() const {
  double s = 0;
  for (int l = 0; l < layers(); ++l) s += forward_s[l] + backward_s[l];
  return s;
}

Model ResNet50() {
  Builder b("resnet50", kCnnFlopPerSecond);
  ConvBn(b, "conv1", "bn1", 7, 3, 64, 112);
  const int blocks[4] = {3, 4, 6, 3};
  const int64_t widths[4] = {64, 128, 256, 512};
  const int64_t sizes[4] = {56, 28, 14, 7};  // output feature map of each stage
  int64_t in = 64;
  for (int s = 0; s < 4; ++s) {
    const int64_t w = widths[s], out = 4 * w, hw = sizes[s];
    for (int i = 0; i < blocks[s]; ++i) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(i) + ".";
      ConvBn(b, p + "conv1", p + "bn1", 1, in, w, (i == 0 && s > 0) ? 2 * hw : hw);
      ConvBn(b, p + "conv2", p + "bn2", 3, w, w, hw);
      ConvBn(b, p + "conv3", p + "bn3", 1, w, out, hw);
      if (i == 0) ConvBn(b, p + "downsample.0", p + "downsample.1", 1, in, out, hw);
      in = out;
    }
  }
  b.Layer(32.0 * 2048 * 1000, {{"fc.weight", 2048 * 1000}, {"fc.bias", 1000}});
  return b.Done();
}

Model Vgg19() {
  Builder b("vgg19", kCnnFlopPerSecond);
  // Configuration E: channels per conv, 0 = max-pool (halves the feature map).
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 256, 0,
                     512, 512, 512, 512, 0, 512, 512, 512, 512, 0};
  int64_t in = 3, hw = 224;
  int n = 0;
  for (int c : cfg) {
    if (c == 0) {
      hw /= 2;
      continue;
    }
    const std::string p = "features." + std::to_string(n++);
    b.Layer(32.0 * 9 * in * c * hw * hw, {{p + ".weight", 9 * in * c}, {p + ".bias", c}});
    in = c;
  }
  const int64_t fc[][2] = {{512 * 7 * 7, 4096}, {4096, 4096}, {4096, 1000}};
  for (int i = 0; i < 3; ++i) {
    const std::string p = "fc" + std::to_string(6 + i);
    b.Layer(32.0 * fc[i][0] * fc[i][1],
            {{p + ".weight", fc[i][0] * fc[i][1]}, {p + ".bias", fc[i][1]}});
  }
  return b.Done();
}

Model Transformer() {
  Builder b("transformer", kTransformerFlopPerSecond);
  constexpr int64_t d = 512, ff = 2048, vocab = 32000;
  constexpr double tokens = 2048;  // per side (source, target) in a 4096-token batch
  auto attention = [&](std::vector<std::pair<std::string, int64_t>>& t, const std::string& p) {
    for (const char* m : {"query", "key", "value", "output"}) {
      t.push_back({p + "." + m + ".weight", d * d});
      t.push_back({p + "." + m + ".bias", d});
    }
  };
  auto norm = [&](std::vector<std::pair<std::string, int64_t>>& t, const std::string& p) {
    t.push_back({p + ".gamma", d});
    t.push_back({p + ".beta", d});
  };
  auto feed_forward = [&](std::vector<std::pair<std::string, int64_t>>& t, const std::string& p) {
    t.push_back({p + ".ff1.weight", d * ff});
    t.push_back({p + ".ff1.bias", ff});
    t.push_back({p + ".ff2.weight", ff * d});
    t.push_back({p + ".ff2.bias", d});
  };
  b.Layer(0, {{"source_embed.weight", vocab * d}});
  for (int i = 0; i < 6; ++i) {
    const std::string p = "encoder." + std::to_string(i);
    std::vector<std::pair<std::string, int64_t>> t;
    attention(t, p + ".self_attention");
    norm(t, p + ".norm1");
    feed_forward(t, p);
    norm(t, p + ".norm2");
    b.Layer(tokens * (4 * d * d + 2 * d * ff), std::move(t));
  }
  b.Layer(0, {{"target_embed.weight", vocab * d}});
  for (int i = 0; i < 6; ++i) {
    const std::string p = "decoder." + std::to_string(i);
    std::vector<std::pair<std::string, int64_t>> t;
    attention(t, p + ".self_attention");
    norm(t, p + ".norm1");
    attention(t, p + ".encoder_attention");
    norm(t, p + ".norm2");
    feed_forward(t, p);
    norm(t, p + ".norm3");
    b.Layer(tokens * (8 * d * d + 2 * d * ff), std::move(t));
  }
  b.Layer(tokens * d * vocab, {{"output.weight", d * vocab}, {"output.bias", vocab}});
  return b.Done();
}

StatusOr<Model> ModelByName(const std::string& name) {
  if (name == "resnet50") return ResNet50();
  if (name == "vgg19") return Vgg19();
  if (name == "transformer") return Transformer();
  return InvalidArgumentError("unknown model '" + name + "': want resnet50, vgg19 or transformer");
}

}  // namespace trellis::bench
