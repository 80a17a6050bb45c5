// The Exchange over Trellis: one key per layer (weight and bias together), gradients summed by
// the parameter servers (aggregate mode) or the optimizer run by them (update mode: the answer
// is the new weights), initial weights broadcast from rank 0; checkpoints of
// weights and momentum through trellis::Checkpointer when the job sets spec.checkpoint.path.
#pragma once

#include <memory>
#include <vector>

#include "examples/mlp/exchange.h"
#include "trellis/checkpoint.h"
#include "trellis/trellis.h"

namespace trellis::mlp {

class TrellisExchange : public Exchange {
 public:
  // Joins the job described by the environment (TRELLIS_SCHEDULER, TRELLIS_RANK, ...).
  static StatusOr<std::unique_ptr<TrellisExchange>> Create();

  int rank() const override { return worker_->rank(); }
  int world() const override { return worker_->size(); }
  bool left() const override { return worker_->world().left; }
  StatusOr<int64_t> Setup(Mlp& model, std::vector<std::vector<float>>& velocity,
                          std::vector<float>& position) override;
  bool CheckpointDue(int64_t step) const override { return checkpoints_->Due(step); }
  Status SaveCheckpoint(int64_t step) override { return checkpoints_->Save(step); }
  Status Commit(int64_t step) override { return checkpoints_->Commit(step); }
  // serverMode: update. The worker learns the mode only as "servers save their optimizer
  // state", which is set exactly in update mode (as trellis.torch's update_mode does).
  bool ReturnsWeights() const override { return worker_->checkpoint_config().servers_save; }
  void Start(int layer, float* grad, int priority) override;
  Status Wait(int layer) override;
  StatusOr<std::vector<double>> SumStats(const std::vector<double>& values) override;
  void ReportProgress(int64_t step, int64_t samples, double loss, int64_t total_steps) override;
  bool restarted() const override;
  bool bytes_short() const override;
  uint64_t bytes_pushed() const override { return worker_->bytes_pushed(); }
  uint64_t bytes_pulled() const override { return worker_->bytes_pulled(); }
  uint64_t compressed_bytes_in() const override { return worker_->compression_stats().bytes_in; }
  uint64_t compressed_bytes_out() const override { return worker_->compression_stats().bytes_out; }

 private:
  int64_t total_steps_ = 0;  // last given to SetTotalSteps
  explicit TrellisExchange(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}

  static constexpr int64_t kStatsSlots = 8;
  std::unique_ptr<Worker> worker_;
  KeyId first_stats_key_ = 0;  // rank r's statistics go on first_stats_key_ + r
  std::unique_ptr<Checkpointer> checkpoints_;  // set by Setup
  std::vector<Handle> handles_;  // one per layer; touched only by the training thread
};

}  // namespace trellis::mlp
