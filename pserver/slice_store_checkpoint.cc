// The server half of checkpoints (docs/checkpoints.md): on a SAVE request from rank 0 every slice
// held here is written with its weights, optimizer state and step count (update mode); on a
// LOAD request the file of that step is installed as the slices' step-0 values, so workers of a
// restarted job pull the restored weights exactly as they would receive a broadcast.
#include <chrono>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/base/logging.h"
#include "pserver/slice_store.h"

namespace trellis {

CheckpointDir SliceStore::Dir() const {
  return CheckpointDir(config_.checkpoint_path,
                       "server-" + std::to_string(config_.server_rank),
                       config_.checkpoint_keep);
}

Checkpoint SliceStore::Snapshot(int64_t step, uint64_t skip_key) const {
  Checkpoint c;
  c.step = step;
  // Spelled here rather than with job_spec's ToString, so the store (and its fuzz target) does
  // not need the job model.
  c.origin = "server " + std::to_string(config_.server_rank) +
             (config_.mode == ServerMode::kUpdate ? " (update mode)" : " (aggregate mode)");
  if (config_.mode != ServerMode::kUpdate) return c;  // sums do not outlive their step
  std::shared_lock map_lock(map_mu_);
  for (const auto& [key, slices] : keys_) {
    if (key == skip_key) continue;
    for (const auto& [index, s] : slices) {
      std::lock_guard lock(s->mu);
      if (!s->initialized) continue;  // nothing to save: it still waits for its broadcast
      const int64_t at = s->step_base + s->complete;
      c.entries.push_back({key, index, EntryKind::kValues, at, s->name, s->weights});
      if (!s->opt.m.empty()) {
        c.entries.push_back({key, index, EntryKind::kOptimizerM, at, s->name, s->opt.m});
      }
      if (!s->opt.v.empty()) {
        c.entries.push_back({key, index, EntryKind::kOptimizerV, at, s->name, s->opt.v});
      }
    }
  }
  return c;
}

Status SliceStore::RestoreFrom(const Checkpoint& c, const std::string& file) {
  std::vector<Deferred> deferred;
  {
    std::shared_lock map_lock(map_mu_);
    if (installed_.empty()) {
      return FailedPreconditionError(file + ": no shard map installed on server " +
                                     std::to_string(config_.server_rank) + " yet");
    }
    // Check everything before changing anything: a bad file leaves the store as it was.
    // Keys not in the map at all were declared after training started (deferred init): they
    // are not part of a restore; the program declares and broadcasts them again.
    for (const auto& e : c.entries) {
      if (all_keys_.count(e.key) == 0) continue;
      Slice* s = Find(e.key, e.slice);
      if (s == nullptr) {
        return FailedPreconditionError(
            file + ": key " + std::to_string(e.key) + " slice " + std::to_string(e.slice) +
            " is not held by server " + std::to_string(config_.server_rank) +
            " in this job's shard map (servers, sliceBytes or keys changed since it was saved)");
      }
      if (static_cast<int64_t>(e.values.size()) != s->num_elements || e.step < 0) {
        return FailedPreconditionError(file + ": " + s->name + " has " +
                                       std::to_string(e.values.size()) + " values at step " +
                                       std::to_string(e.step) + ", the slice has " +
                                       std::to_string(s->num_elements) + " elements");
      }
      std::lock_guard lock(s->mu);
      if (s->complete != 0 || s->pushes != 0) {
        return FailedPreconditionError(file + ": " + s->name + " already trained to step " +
                                       std::to_string(s->complete) +
                                       "; restore before the first push");
      }
    }
    for (const auto& e : c.entries) {
      if (all_keys_.count(e.key) == 0) continue;
      Slice* s = Find(e.key, e.slice);
      std::lock_guard lock(s->mu);
      switch (e.kind) {
        case EntryKind::kOptimizerM: s->opt.m = e.values; break;
        case EntryKind::kOptimizerV: s->opt.v = e.values; break;
        case EntryKind::kValues: {
          s->weights = e.values;
          auto v = std::make_shared<const std::vector<float>>(e.values);
          s->results[0] = v;
          s->result_step[0] = 0;
          s->results[1] = nullptr;
          s->result_step[1] = -1;
          s->initialized = true;
          s->step_base = e.step;
          // Wake pulls of step 0 that came first.
          for (auto it = s->waiters.begin(); it != s->waiters.end();) {
            if (it->step == 0) {
              deferred.push_back({std::move(it->reply), Status::Ok(), v, nullptr});
              it = s->waiters.erase(it);
            } else {
              ++it;
            }
          }
          break;
        }
      }
    }
  }
  for (auto& d : deferred) d.reply(d.status, Answer{std::move(d.values), nullptr});
  return Status::Ok();
}

Status SliceStore::HandleCheckpointOp(const wire::RequestHeader& h) {
  if (config_.checkpoint_path.empty()) {
    return FailedPreconditionError("server " + std::to_string(config_.server_rank) +
                                   ": checkpoint request but the job has no checkpoint.path");
  }
  if (h.step < 0) {
    return InvalidArgumentError(std::string(wire::OpName(h.op)) + " of step " +
                                std::to_string(h.step));
  }
  CheckpointDir dir = Dir();
  if (h.op == wire::Op::kSave) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    auto file = dir.Save(Snapshot(h.step, h.key), &bytes);
    if (!file.ok()) return file.status();
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    series_.CheckpointSaved(secs, bytes);
    TLOG_INFO << "saved step " << h.step << " to " << *file << " (" << bytes << " bytes, " << secs
              << " s)";
    return Status::Ok();
  }
  auto c = dir.Load(h.step);
  if (!c.ok()) return c.status();
  TRELLIS_RETURN_IF_ERROR(RestoreFrom(*c, dir.FileFor(h.step)));
  series_.CheckpointRestored();
  TLOG_INFO << "restored step " << h.step << " from " << dir.FileFor(h.step) << " ("
            << c->entries.size() << " entries)";
  return Status::Ok();
}

}  // namespace trellis
