#include "pserver/slice_checkpoints.h"

#include <chrono>
#include <vector>

#include "common/base/logging.h"

namespace trellis {

CheckpointDir SliceCheckpoints::Dir() const {
  return CheckpointDir(config_.checkpoint_path,
                       "server-" + std::to_string(config_.server_rank),
                       config_.checkpoint_keep);
}

Checkpoint SliceCheckpoints::Snapshot(int64_t step, uint64_t skip_key) const {
  Checkpoint c;
  c.step = step;
  // Spelled here rather than with job_spec's ToString, so the store (and its fuzz target) does
  // not need the job model.
  c.origin = "server " + std::to_string(config_.server_rank) +
             (config_.mode == ServerMode::kUpdate ? " (update mode)" : " (aggregate mode)");
  if (config_.mode != ServerMode::kUpdate) return c;  // sums do not outlive their step
  ReaderMutexLock map_lock(table_->mu());
  for (Slice* s : table_->All()) {
    if (s->key == skip_key) continue;
    MutexLock lock(&s->mu);
    if (!s->initialized) continue;  // nothing to save: it still waits for its broadcast
    const int64_t at = s->weights.step_base + s->complete;
    c.entries.push_back({s->key, s->index, EntryKind::kValues, at, s->name, s->weights.values});
    if (!s->weights.opt.m.empty()) {
      c.entries.push_back(
          {s->key, s->index, EntryKind::kOptimizerM, at, s->name, s->weights.opt.m});
    }
    if (!s->weights.opt.v.empty()) {
      c.entries.push_back(
          {s->key, s->index, EntryKind::kOptimizerV, at, s->name, s->weights.opt.v});
    }
  }
  return c;
}

Status SliceCheckpoints::RestoreFrom(const Checkpoint& c, const std::string& file) {
  std::vector<DeferredReply> deferred;
  {
    ReaderMutexLock map_lock(table_->mu());
    if (!table_->installed()) {
      return FailedPreconditionError(file + ": no shard map installed on server " +
                                     std::to_string(config_.server_rank) + " yet");
    }
    // Check everything before changing anything: a bad file leaves the store as it was.
    // Keys not in the map at all were declared after training started (deferred init): they
    // are not part of a restore; the program declares and broadcasts them again.
    for (const auto& e : c.entries) {
      if (!table_->InMap(e.key)) continue;
      Slice* s = table_->Find(e.key, e.slice);
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
      MutexLock lock(&s->mu);
      if (s->complete != 0 || s->pushes != 0) {
        return FailedPreconditionError(file + ": " + s->name + " already trained to step " +
                                       std::to_string(s->complete) +
                                       "; restore before the first push");
      }
    }
    for (const auto& e : c.entries) {
      if (!table_->InMap(e.key)) continue;
      Slice* s = table_->Find(e.key, e.slice);
      MutexLock lock(&s->mu);
      switch (e.kind) {
        case EntryKind::kOptimizerM: s->weights.opt.m = e.values; break;
        case EntryKind::kOptimizerV: s->weights.opt.v = e.values; break;
        case EntryKind::kValues: {
          s->weights.values = e.values;
          auto v = std::make_shared<const std::vector<float>>(e.values);
          s->results.Restart(v);
          s->initialized = true;
          s->weights.step_base = e.step;
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

Status SliceCheckpoints::RestoreNewest(std::string* file, int64_t* step) {
  auto c = Dir().LoadNewest();
  if (!c.ok()) return c.status();
  TRELLIS_RETURN_IF_ERROR(RestoreFrom(c->checkpoint, c->file));
  series_->CheckpointRestored();
  *file = c->file;
  *step = c->checkpoint.step;
  return Status::Ok();
}

Status SliceCheckpoints::HandleOp(const wire::RequestHeader& h) {
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
    series_->CheckpointSaved(secs, bytes);
    TLOG_INFO << "saved step " << h.step << " to " << *file << " (" << bytes << " bytes, " << secs
              << " s)";
    return Status::Ok();
  }
  auto c = dir.Load(h.step);
  if (!c.ok()) return c.status();
  TRELLIS_RETURN_IF_ERROR(RestoreFrom(*c, dir.FileFor(h.step)));
  series_->CheckpointRestored();
  TLOG_INFO << "restored step " << h.step << " from " << dir.FileFor(h.step) << " ("
            << c->entries.size() << " entries)";
  return Status::Ok();
}

}  // namespace trellis
