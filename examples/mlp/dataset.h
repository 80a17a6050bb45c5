// The synthetic classification task: inputs are standard-normal vectors, labels are the argmax
// of a fixed-seed random "teacher" network (input -> hidden ReLU -> classes). The student MLP is
// larger than the teacher, so the task is learnable to near 100%; what limits accuracy in a
// short run is the samples seen and the points close to the teacher's decision boundaries.
// The teacher's output biases are calibrated so the classes are roughly balanced (a random
// network's argmax otherwise favours a few classes and accuracy would mean little).
#pragma once

#include <cstdint>
#include <vector>

namespace trellis::mlp {

struct TaskOptions {
  int64_t input_dim = 64;
  int64_t teacher_hidden = 64;
  int64_t classes = 10;
  int64_t latent_dim = 16;   // inputs lie near a random subspace of this dimension; 0 = full
  double min_margin = 0.3;   // samples whose teacher top-2 logit gap is below this are redrawn
  uint64_t seed = 7;         // the teacher and the data; not the training seed
  double label_noise = 0.0;  // fraction of training labels replaced by a uniform random class
};

struct Dataset {
  int64_t size = 0;
  int64_t dim = 0;
  std::vector<float> x;    // [size x dim]
  std::vector<int32_t> y;  // [size]
  const float* row(int64_t i) const { return x.data() + i * dim; }
};

class Teacher {
 public:
  explicit Teacher(const TaskOptions& options);
  int32_t Label(const float* x) const;
  // Teacher logits of one input.
  void Logits(const float* x, float* out) const;
  // The input map of the task's latent subspace ([input x latent]; empty when latent_dim is 0).
  const std::vector<float>& projection() const { return projection_; }

 private:
  TaskOptions options_;
  std::vector<float> w1_, b1_, w2_, b2_;  // w1: [hidden x input], w2: [classes x hidden]
  std::vector<float> projection_;
};

// The training set (stream 1) and the held-out test set (stream 2) never share samples' seeds.
Dataset MakeTrainSet(const TaskOptions& options, int64_t size);
Dataset MakeTestSet(const TaskOptions& options, int64_t size);

// Worker `rank` of `world`'s contiguous shard. Every shard has floor(size / world) samples so
// all workers run the same number of steps per epoch (synchronous training needs that).
Dataset Shard(const Dataset& full, int rank, int world);

}  // namespace trellis::mlp
