#include "examples/mlp/trellis_exchange.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/config/env_names.h"

namespace trellis::mlp {

StatusOr<std::unique_ptr<TrellisExchange>> TrellisExchange::Create() {
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create());
  return std::unique_ptr<TrellisExchange>(new TrellisExchange(std::move(worker)));
}

StatusOr<int64_t> TrellisExchange::Setup(Mlp& model, std::vector<std::vector<float>>& velocity,
                                         std::vector<float>& position) {
  const int layers = model.num_layers();
  std::vector<TensorRef> params;
  std::vector<TensorRef> state;
  for (int l = 0; l < layers; ++l) {
    const std::string name = "layer" + std::to_string(l);
    TRELLIS_RETURN_IF_ERROR(worker_->DeclareKey(
        {.id = static_cast<KeyId>(l), .name = name, .num_elements = model.layer_size(l)}));
    params.push_back({name, model.params(l), model.layer_size(l), static_cast<KeyId>(l)});
    state.push_back({name + ".velocity", velocity[l].data(), model.layer_size(l)});
  }
  position.resize(kPositionSlots);
  state.push_back({"position", position.data(), kPositionSlots});
  // One stats key per rank, each broadcast once from its rank at the end (SumStats): valid in
  // both server modes (an update-mode server would run the optimizer on a pushed sum), and
  // never compressed, whatever the job's compression, so statistics sum exactly.
  first_stats_key_ = static_cast<KeyId>(layers);
  // For every rank the job can have, not only the world's: a worker joining or restarting in a
  // smaller world declares the same keys as the others (keys may only be added once training ran).
  const int stats_ranks = std::max(worker_->size(), worker_->world().slots);
  for (int r = 0; r < stats_ranks; ++r) {
    TRELLIS_RETURN_IF_ERROR(worker_->DeclareKey({.id = first_stats_key_ + static_cast<KeyId>(r),
                                                 .name = "stats" + std::to_string(r),
                                                 .num_elements = kStatsSlots,
                                                 .allow_compression = false}));
  }
  TRELLIS_ASSIGN_OR_RETURN(checkpoints_,
                           Checkpointer::Create(*worker_, std::move(params), std::move(state)));
  TRELLIS_RETURN_IF_ERROR(worker_->FinishDeclarations());
  handles_.assign(layers, Handle());
  // The initial broadcast, or the restore of rank 0's newest checkpoint.
  return checkpoints_->Restore();
}

void TrellisExchange::Start(int layer, float* grad, int priority) {
  handles_[layer] = worker_->PushPull(static_cast<KeyId>(layer), grad, grad, priority);
}

Status TrellisExchange::Wait(int layer) { return handles_[layer].Wait(); }

StatusOr<std::vector<double>> TrellisExchange::SumStats(const std::vector<double>& values) {
  if (static_cast<int64_t>(values.size()) > kStatsSlots) {
    return InvalidArgumentError("too many statistics for the stats key");
  }
  // Every rank broadcasts its numbers on its own key; each sums them in rank order, so every
  // rank gets the same totals. Floats carry ~7 significant digits: plenty for a report.
  const int world = worker_->size();
  std::vector<std::vector<float>> bufs(world, std::vector<float>(kStatsSlots, 0.0f));
  for (size_t i = 0; i < values.size(); ++i) bufs[rank()][i] = static_cast<float>(values[i]);
  std::vector<Handle> handles;
  for (int r = 0; r < world; ++r) {
    handles.push_back(worker_->Broadcast(first_stats_key_ + static_cast<KeyId>(r), bufs[r].data(), r));
  }
  Status first;  // wait for all before returning: each handle writes into bufs
  for (const Handle& h : handles) {
    if (Status st = h.Wait(); !st.ok() && first.ok()) first = st;
  }
  TRELLIS_RETURN_IF_ERROR(first);
  std::vector<double> sums(values.size(), 0.0);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < values.size(); ++i) sums[i] += bufs[r][i];
  }
  return sums;
}

bool TrellisExchange::restarted() const {
  // The agent numbers each start of the program (docs/checkpoints.md#crash-recovery-workers).
  const char* incarnation = std::getenv(kEnvIncarnation);
  return incarnation != nullptr && std::atoi(incarnation) > 1;
}

bool TrellisExchange::bytes_short() const {
  // The worker's counts include every earlier program its agent's byte ledger saw
  // (docs/user-guide.md#byte-totals): short only when the ledger started after incarnation 1.
  if (!restarted()) return false;
  const char* since = std::getenv(kEnvLedgerSince);
  return since == nullptr || std::atoi(since) != 1;
}

void TrellisExchange::ReportProgress(int64_t step, int64_t samples, double loss,
                                     int64_t total_steps) {
  // Progress is for display: a failure here must not stop training.
  if (total_steps != total_steps_) {
    total_steps_ = total_steps;
    (void)worker_->SetTotalSteps(total_steps);
  }
  (void)worker_->ReportProgress(step, samples, loss);
}

}  // namespace trellis::mlp
