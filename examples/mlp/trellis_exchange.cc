#include "examples/mlp/trellis_exchange.h"

#include <string>

namespace trellis::mlp {

StatusOr<std::unique_ptr<TrellisExchange>> TrellisExchange::Create() {
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<Worker> worker, Worker::Create());
  return std::unique_ptr<TrellisExchange>(new TrellisExchange(std::move(worker)));
}

Status TrellisExchange::Setup(Mlp& model) {
  const int layers = model.num_layers();
  for (int l = 0; l < layers; ++l) {
    TRELLIS_RETURN_IF_ERROR(worker_->DeclareKey(
        {.id = static_cast<KeyId>(l), .name = "layer" + std::to_string(l),
         .num_elements = model.layer_size(l)}));
  }
  stats_key_ = static_cast<KeyId>(layers);
  TRELLIS_RETURN_IF_ERROR(
      worker_->DeclareKey({.id = stats_key_, .name = "stats", .num_elements = kStatsSlots}));
  TRELLIS_RETURN_IF_ERROR(worker_->FinishDeclarations());
  handles_.assign(layers, Handle());
  for (int l = 0; l < layers; ++l) handles_[l] = worker_->Broadcast(l, model.params(l), 0);
  for (int l = 0; l < layers; ++l) {
    TRELLIS_RETURN_IF_ERROR(handles_[l].Wait().Annotate("broadcast of layer " + std::to_string(l)));
  }
  return Status::Ok();
}

void TrellisExchange::Start(int layer, float* grad, int priority) {
  handles_[layer] = worker_->PushPull(static_cast<KeyId>(layer), grad, grad, priority);
}

Status TrellisExchange::Wait(int layer) { return handles_[layer].Wait(); }

StatusOr<std::vector<double>> TrellisExchange::SumStats(const std::vector<double>& values) {
  if (static_cast<int64_t>(values.size()) > kStatsSlots) {
    return InvalidArgumentError("too many statistics for the stats key");
  }
  // Floats carry ~7 significant digits: plenty for sample and byte totals in a report.
  std::vector<float> buf(kStatsSlots, 0.0f);
  for (size_t i = 0; i < values.size(); ++i) buf[i] = static_cast<float>(values[i]);
  TRELLIS_RETURN_IF_ERROR(worker_->PushPull(stats_key_, buf.data(), buf.data()).Wait());
  return std::vector<double>(buf.begin(), buf.begin() + static_cast<int64_t>(values.size()));
}

}  // namespace trellis::mlp
