// The three models bench_p3 simulates, from their real layer shapes: every parameter tensor
// (one key each) with the layer it belongs to, and each layer's forward and backward compute
// time. Sources and assumptions are in models.cc.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace trellis::bench {

struct Tensor {
  std::string name;     // "layer3.1.conv2.weight"
  int64_t elements = 0;
  int layer = 0;        // index in forward order; its priority is -layer
};

struct Model {
  std::string name;
  std::vector<Tensor> tensors;       // forward order
  std::vector<double> forward_s;     // per layer, at the assumed GPU speed
  std::vector<double> backward_s;    // per layer (2x forward: gradients of inputs and weights)
  int layers() const { return static_cast<int>(forward_s.size()); }
  int64_t parameters() const;
  double compute_s() const;          // forward + backward of one step
};

Model ResNet50();
Model Vgg19();
Model Transformer();  // Sockeye-like transformer-base, 6+6 layers
// "resnet50", "vgg19", "transformer".
StatusOr<Model> ModelByName(const std::string& name);

}  // namespace trellis::bench
