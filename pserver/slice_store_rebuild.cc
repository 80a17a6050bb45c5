// Crash recovery of a parameter server (docs/checkpoints.md, "Crash recovery: servers"): a
// restarted server is fresh; every worker reconnects, re-installs the shard map and replays the
// last two pushes it made on each slice held here (wire::Op::kReplay), then ends its replays.
//
// Why two pushes are enough: on one slice the workers are at most one step apart (a worker
// pushes t+1 only after its pull of t, which needed every push of t), so the union of the
// workers' last two pushes holds every contribution of the newest complete step and of the one
// in progress. Per slice the rebuild keeps the contributions per step and worker (a worker's
// duplicate is ignored); once all W workers ended their replays, the highest step with all W
// contributions becomes `complete` (its sum, or in update mode the optimizer applied on top of
// the newest checkpoint), the contributions of the step after it the accumulator, and older
// steps are dropped. Pulls wait for that; pushes that come meanwhile are contributions too.
#include <algorithm>
#include <map>

#include "common/base/logging.h"
#include "pserver/slice_store.h"

namespace trellis {

bool SliceStore::Rebuilding() const {
  std::lock_guard lock(rebuild_mu_);
  return rebuild_phase_ == RebuildPhase::kRebuilding;
}

void SliceStore::StartRebuildLocked() {
  const int32_t w = config_.num_workers;
  replays_seen_.assign(w, 0);
  replays_announced_.assign(w, -1);
  bool fresh = true;
  {
    std::shared_lock map_lock(map_mu_);
    for (const auto& [key, slices] : keys_) {
      for (const auto& [index, s] : slices) {
        std::lock_guard lock(s->mu);
        if (s->complete != 0 || s->pushes != 0) fresh = false;
      }
    }
  }
  if (!fresh) {
    // A live server (a worker's connection broke, the server did not): replays only fill in
    // pushes that may have been lost on the way.
    rebuild_phase_ = RebuildPhase::kOver;
    TLOG_INFO << "replays on a live server: treated as pushes not yet counted";
    return;
  }
  const std::string who = "server " + std::to_string(config_.server_rank);
  if (config_.mode == ServerMode::kUpdate) {
    // The weights live only here: they come back from the newest checkpoint, the replayed
    // steps are applied on top (the steps in between are lost on this server's slices).
    if (config_.checkpoint_path.empty()) {
      rebuild_error_ = FailedPreconditionError(
          who + " restarted in update mode but the job has no checkpoint.path: its weights are "
                "lost and the job cannot continue (set spec.checkpoint to recover from the "
                "newest checkpoint)");
    } else {
      auto c = Dir().LoadNewest();
      Status st = c.ok() ? RestoreFrom(c->checkpoint, c->file) : c.status();
      if (!st.ok()) {
        rebuild_error_ = FailedPreconditionError(
            who + " restarted in update mode and cannot reload its weights: " + st.ToString());
      } else {
        series_.CheckpointRestored();
        TLOG_INFO << "restarted: reloaded " << c->file << " (step " << c->checkpoint.step
                  << "); replayed steps are applied on top";
      }
    }
    if (!rebuild_error_.ok()) {
      TLOG_ERROR << rebuild_error_.ToString();
      rebuild_phase_ = RebuildPhase::kOver;
      return;
    }
  }
  std::shared_lock map_lock(map_mu_);
  for (const auto& [key, slices] : keys_) {
    for (const auto& [index, s] : slices) {
      std::lock_guard lock(s->mu);
      s->rebuild = std::make_unique<Rebuild>();
      s->rebuild->restored_step = s->step_base;
      s->step_base = 0;  // worker steps count the optimizer's steps again (docs/checkpoints.md)
    }
  }
  rebuild_phase_ = RebuildPhase::kRebuilding;
  TLOG_INFO << who << ": fresh and receiving replays: rebuilding " << num_slices_ << " slices";
}

void SliceStore::HandleReplay(int32_t worker, const wire::RequestHeader& h,
                              const wire::Chunks& frame, Reply reply) {
  std::vector<Deferred> deferred;
  Status st;
  {
    std::lock_guard rebuild_lock(rebuild_mu_);
    {
      std::shared_lock map_lock(map_mu_);
      if (installed_.empty()) {
        st = FailedPreconditionError("replay before the shard map was installed on server " +
                                     std::to_string(config_.server_rank));
      }
    }
    if (st.ok() && rebuild_phase_ == RebuildPhase::kNotSeen) StartRebuildLocked();
    if (st.ok()) st = rebuild_error_;
    if (st.ok() && h.payload_bytes == 0) {
      // The worker's last word: how many replays it sent before this.
      if (h.step < 0) {
        st = InvalidArgumentError("replay end with a negative count " + std::to_string(h.step));
      } else {
        replays_announced_[worker] = h.step;
      }
    } else if (st.ok()) {
      // The payload is the push request as it was first sent.
      const wire::Chunks inner =
          wire::SubChunks(frame, wire::kRequestHeaderBytes, h.payload_bytes);
      wire::RequestHeader ih;
      uint64_t id = 0;
      st = wire::DecodeRequest(inner, &ih, &id);
      if (st.ok() && ((ih.op != wire::Op::kPush && ih.op != wire::Op::kPushTwoBit) ||
                      ih.key != h.key || ih.slice != h.slice || ih.step != h.step)) {
        st = InvalidArgumentError("replay of key " + std::to_string(h.key) + " slice " +
                                  std::to_string(h.slice) + " step " + std::to_string(h.step) +
                                  " carries a " + wire::OpName(ih.op) + " of key " +
                                  std::to_string(ih.key) + " slice " + std::to_string(ih.slice) +
                                  " step " + std::to_string(ih.step) + ", not that push");
      }
      std::shared_lock map_lock(map_mu_);
      Slice* s = st.ok() ? Find(h.key, h.slice) : nullptr;
      if (st.ok() && s == nullptr) st = Describe404(h.key, h.slice);
      std::vector<uint8_t> scratch;
      CodedFrame coded;
      if (st.ok()) st = CheckPayload(*s, ih, inner, &scratch, &coded);
      if (st.ok()) {
        const Gradient grad{&inner, wire::IsTwoBit(ih.op) ? &coded : nullptr};
        std::lock_guard lock(s->mu);
        ++replays_seen_[worker];
        if (s->rebuild) {
          RebuildRequest(worker, s, ih, grad, nullptr, &deferred);
        } else if (rebuild_phase_ == RebuildPhase::kOver && ih.step == s->complete + 1 &&
                   !s->pushed[worker]) {
          // A live server that never got this push (it was lost with the connection).
          st = Push(worker, s, ih, grad, &deferred);
        }  // else: already counted
      }
    }
    if (st.ok() && rebuild_phase_ == RebuildPhase::kRebuilding) {
      bool all = true;
      for (int32_t w = 0; w < config_.num_workers; ++w) {
        all = all && replays_announced_[w] >= 0 && replays_seen_[w] >= replays_announced_[w];
      }
      if (all) FinishRebuildLocked(&deferred);
    }
  }
  if (!st.ok()) series_.RequestFailed();
  reply(st, Answer{});
  for (auto& d : deferred) {
    if (!d.status.ok()) series_.RequestFailed();
    d.reply(d.status, Answer{std::move(d.values), std::move(d.packed)});
  }
}

void SliceStore::RebuildRequest(int32_t worker, Slice* s, const wire::RequestHeader& h,
                                const Gradient& grad, Reply reply, std::vector<Deferred>* out) {
  if (wire::OpHasPayload(h.op)) {  // a push or pushpull, float32 or 2-bit
    auto& per_worker = s->rebuild->steps[h.step];
    per_worker.resize(config_.num_workers);
    if (!per_worker[worker]) {  // a worker's duplicate (replayed and sent again) counts once
      auto g = std::make_unique<std::vector<float>>(s->num_elements);
      if (grad.coded != nullptr) {
        DecodeCodedFrame(*grad.coded, g->data());
      } else {
        wire::CopyFloats(*grad.frame, wire::kRequestHeaderBytes, g->size(), g->data());
      }
      per_worker[worker] = std::move(g);
    }
  }
  if (!reply) return;
  if (h.op == wire::Op::kPush || h.op == wire::Op::kPushTwoBit) {
    out->push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
  } else {  // answered when the rebuild ends
    s->waiters.push_back({h.step, wire::AcceptsPacked(h.op), std::move(reply)});
    series_.PullWaiting();
  }
}

void SliceStore::FinishRebuildLocked(std::vector<Deferred>* out) {
  int64_t rebuilt = 0;
  {
    std::shared_lock map_lock(map_mu_);
    for (const auto& [key, slices] : keys_) {
      for (const auto& [index, s] : slices) {
        std::lock_guard lock(s->mu);
        if (!s->rebuild) continue;
        FinalizeSlice(s.get(), out);
        ++rebuilt;
      }
    }
  }
  rebuild_phase_ = RebuildPhase::kOver;
  series_.SlicesRebuilt(rebuilt);
  TLOG_INFO << "server " << config_.server_rank << ": rebuilt " << rebuilt
            << " slices from the workers' replays";
}

Values SliceStore::StepResult(Slice* s, int64_t step, std::vector<float>* sum) {
  if (config_.mode == ServerMode::kAggregate) {
    return std::make_shared<const std::vector<float>>(std::move(*sum));
  }
  const float inv = 1.0f / static_cast<float>(config_.num_workers);
  for (float& g : *sum) g *= inv;
  ApplyOptimizer(config_.optimizer, s->step_base + step, sum->data(), s->weights.data(),
                 s->num_elements, &s->opt);
  return std::make_shared<const std::vector<float>>(s->weights);
}

void SliceStore::FinalizeSlice(Slice* s, std::vector<Deferred>* out) {
  auto steps = std::move(s->rebuild->steps);
  const int64_t restored_step = s->rebuild->restored_step;
  s->rebuild.reset();
  const int32_t w = config_.num_workers;
  auto full = [&](const std::vector<std::unique_ptr<std::vector<float>>>& c) {
    return static_cast<int32_t>(std::count_if(c.begin(), c.end(), [](const auto& g) {
             return g != nullptr;
           })) == w;
  };
  auto sum_of = [&](const std::vector<std::unique_ptr<std::vector<float>>>& c) {
    auto sum = std::make_unique<std::vector<float>>(s->num_elements, 0.0f);
    for (const auto& g : c) {
      if (!g) continue;
      for (size_t i = 0; i < sum->size(); ++i) (*sum)[i] += (*g)[i];
    }
    return sum;
  };
  const bool update = config_.mode == ServerMode::kUpdate;
  if (!steps.empty() && update && !s->initialized) {
    for (auto& wt : s->waiters) {
      series_.PullAnswered();
      out->push_back({std::move(wt.reply),
                      FailedPreconditionError(s->name + ": not in the newest checkpoint; its "
                                              "weights were lost with the server"),
                      nullptr, nullptr});
    }
    s->waiters.clear();
    return;
  }
  if (!steps.empty()) {
    int64_t complete = steps.begin()->first - 1;  // no full step: the first one is in progress
    for (const auto& [step, c] : steps) {
      if (full(c)) complete = step;
    }
    complete = std::max<int64_t>(complete, 0);
    if (complete > 0) {  // else keep step 0 (a broadcast that came during the rebuild)
      for (int i = 0; i < 2; ++i) {
        s->results[i] = nullptr;
        s->result_step[i] = -1;
        s->packable[i] = 0;  // rebuilt results are answered as float32
        s->packed[i] = nullptr;
      }
    }
    for (int64_t step : {complete - 1, complete}) {
      auto it = steps.find(step);
      if (step < 1 || it == steps.end() || !full(it->second)) continue;
      if (update && step <= restored_step) continue;  // already in the reloaded weights
      s->results[step % 2] = StepResult(s, step, sum_of(it->second).get());
      s->result_step[step % 2] = step;
    }
    if (update && complete > 0 && s->result_step[complete % 2] != complete) {
      // Nothing of that step survived: its weights are the newest ones this server has.
      s->results[complete % 2] = std::make_shared<const std::vector<float>>(s->weights);
      s->result_step[complete % 2] = complete;
    }
    s->complete = complete;
    s->pushes = 0;
    s->step_threshold = 0;  // the rebuilt accumulator is answered as float32 too
    std::fill(s->pushed.begin(), s->pushed.end(), false);
    s->accum.reset();
    if (auto it = steps.find(complete + 1); it != steps.end()) {
      s->accum = sum_of(it->second);
      for (int32_t i = 0; i < w; ++i) {
        if (it->second[i]) {
          s->pushed[i] = true;
          ++s->pushes;
        }
      }
    }
    if (!update && complete > 0) s->initialized = true;
  }
  // Pulls that came during the rebuild: answered now, or still waiting for complete+1.
  std::vector<Waiter> waiting = std::move(s->waiters);
  s->waiters.clear();
  for (auto& wt : waiting) {
    if (wt.step == s->complete + 1 || (wt.step == 0 && !s->initialized && s->complete == 0)) {
      s->waiters.push_back(std::move(wt));
      continue;
    }
    series_.PullAnswered();
    if (Values v = ResultFor(s, wt.step)) {
      out->push_back({std::move(wt.reply), Status::Ok(), std::move(v),
                      wt.packed ? PackedFor(s, wt.step) : nullptr});
    } else {
      out->push_back({std::move(wt.reply),
                      OutOfRangeError(s->name + ": pull of step " + std::to_string(wt.step) +
                                      " after the server's restart: it kept steps up to " +
                                      std::to_string(s->complete) + " (lost with the server)"),
                      nullptr, nullptr});
    }
  }
}

}  // namespace trellis
