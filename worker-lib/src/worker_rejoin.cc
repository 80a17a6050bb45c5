// WorkerImpl: what the checkpointer needs to let a restarted worker rejoin a running job
// (docs/checkpoints.md#crash-recovery-workers): moving a commit through the servers' stash, and the
// per-key step counters a rejoiner takes over from its donor.
#include <climits>

#include "worker-lib/src/worker_impl.h"

namespace trellis {

Handle WorkerImpl::Transfer(wire::Op op, KeyId key, uint64_t id, float* data) {
  if (op != wire::Op::kStash && op != wire::Op::kFetch) {
    return Failed(InvalidArgumentError(std::string("Transfer: ") + wire::OpName(op) +
                                       " is not a stash or fetch"),
                  nullptr);
  }
  // A broadcast's priority: a rejoin holds up every worker of the job.
  return Start(op == wire::Op::kStash ? "Stash" : "Fetch", op, key,
               op == wire::Op::kStash ? data : nullptr, op == wire::Op::kFetch ? data : nullptr,
               INT_MAX - 1, nullptr, /*broadcast=*/false, static_cast<int64_t>(id));
}

std::vector<std::pair<KeyId, int64_t>> WorkerImpl::PushSteps() const {
  std::shared_lock keys_lock(keys_mu_);
  std::vector<std::pair<KeyId, int64_t>> out;
  out.reserve(keys_.size());
  for (const auto& [id, k] : keys_) out.emplace_back(id, k->push_step.load());
  return out;
}

Status WorkerImpl::SetPushSteps(const std::vector<std::pair<KeyId, int64_t>>& steps) {
  std::shared_lock keys_lock(keys_mu_);
  for (const auto& [id, step] : steps) {
    auto it = keys_.find(id);
    if (it == keys_.end()) {
      return FailedPreconditionError("rejoin: the donor has key " + std::to_string(id) +
                                     " that this worker did not declare");
    }
    if (step < 0) {
      return InvalidArgumentError("rejoin: step " + std::to_string(step) + " for key " +
                                  std::to_string(id));
    }
  }
  for (const auto& [id, step] : steps) keys_.at(id)->push_step.store(step);
  return Status::Ok();
}

}  // namespace trellis
