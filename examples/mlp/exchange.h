// How a trainer shares gradients and initial weights with its peers. The trainer only sees
// this interface, so the same training loop runs alone (--local, tests) or over Trellis.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "examples/mlp/mlp.h"

namespace trellis::mlp {

// Where training stands, kept with the optimizer state: the epoch, its first global step and its
// steps per epoch as counted when it was kept. A resize changes the steps per epoch, so a
// restored step alone does not say where in which epoch it lies. Zeros: a fresh start.
inline constexpr int kPositionSlots = 3;

class Exchange {
 public:
  virtual ~Exchange() = default;
  // This worker's rank and the number of workers now. In an elastic job both change inside
  // Commit (docs/elastic.md); left(): this worker was resized away and stops there.
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual bool left() const { return false; }
  // Once, after every worker initialized its own model: declares one key per layer and makes
  // every worker's parameters, `velocity` (the optimizer's momentum, one vector per layer) and
  // `position` (kPositionSlots: where training stands) equal to rank 0's, restored from the
  // newest checkpoint when the job has one, or a live worker's (a restarted or joining worker).
  // Returns the global step training resumes after (0: from the start).
  virtual StatusOr<int64_t> Setup(Mlp& model, std::vector<std::vector<float>>& velocity,
                                  std::vector<float>& position) = 0;
  // Whether a checkpoint is due after global step `step` (1-based). The trainer then applies
  // every pending update, so parameters and velocity are those after `step`, and calls
  // SaveCheckpoint(step).
  virtual bool CheckpointDue(int64_t /*step*/) const { return false; }
  virtual Status SaveCheckpoint(int64_t /*step*/) { return Status::Ok(); }
  // Every update of global step `step` is applied and no gradient of step+1 is on its way yet:
  // the point a restarted worker can rejoin from (crash recovery; trellis::Checkpointer::Commit).
  virtual Status Commit(int64_t /*step*/) { return Status::Ok(); }
  // Whether Wait's answer is the layer's new weights (the job's `serverMode: update`: the
  // servers run the job's optimizer) instead of the gradient sum (aggregate mode: the trainer
  // runs its own SGD with momentum).
  virtual bool ReturnsWeights() const { return false; }
  // Starts summing `grad` (layer `layer`'s gradient) over all workers, in place (or, when
  // ReturnsWeights(), replacing it by the new weights). Returns at once; `grad` must stay
  // untouched until Wait(layer) returns.
  virtual void Start(int layer, float* grad, int priority) = 0;
  // Blocks until the answer started by Start(layer) is in place.
  virtual Status Wait(int layer) = 0;
  // Sums a few numbers over all workers (end-of-run statistics). Blocking, collective.
  virtual StatusOr<std::vector<double>> SumStats(const std::vector<double>& values) = 0;
  // Training progress after global step `step` (Worker::ReportProgress): samples this worker
  // processed in it, its loss, and the job's total steps.
  virtual void ReportProgress(int64_t /*step*/, int64_t /*samples*/, double /*loss*/,
                              int64_t /*total_steps*/) {}
  // Whether this process is a restart of the worker (it rejoined), and whether its byte counters
  // miss some earlier process's bytes (those ran under another agent: a replaced pod).
  virtual bool restarted() const { return false; }
  virtual bool bytes_short() const { return false; }
  virtual uint64_t bytes_pushed() const = 0;
  virtual uint64_t bytes_pulled() const = 0;
  // Gradient bytes that went through the job's compression, before and after (0: none).
  virtual uint64_t compressed_bytes_in() const { return 0; }
  virtual uint64_t compressed_bytes_out() const { return 0; }
};

// One worker, no peers: the sum of one gradient is itself.
class LocalExchange : public Exchange {
 public:
  int rank() const override { return 0; }
  int world() const override { return 1; }
  StatusOr<int64_t> Setup(Mlp&, std::vector<std::vector<float>>&, std::vector<float>&) override {
    return int64_t{0};
  }
  void Start(int, float*, int) override {}
  Status Wait(int) override { return Status::Ok(); }
  StatusOr<std::vector<double>> SumStats(const std::vector<double>& v) override { return v; }
  uint64_t bytes_pushed() const override { return 0; }
  uint64_t bytes_pulled() const override { return 0; }
};

}  // namespace trellis::mlp
