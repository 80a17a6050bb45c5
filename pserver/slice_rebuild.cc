#include "pserver/slice_rebuild.h"

#include <algorithm>
#include <map>
#include <memory>

#include "common/base/logging.h"

namespace trellis {

void SliceRebuild::RunDeferred(std::vector<DeferredReply>* deferred) {
  for (auto& d : *deferred) {
    if (!d.status.ok()) series_->RequestFailed();
    d.reply(d.status, Answer{std::move(d.values), std::move(d.packed)});
  }
}

bool SliceRebuild::Rebuilding() const {
  MutexLock lock(&mu_);
  return phase_ == Phase::kRebuilding;
}

void SliceRebuild::StartLocked() {
  const int32_t w = config_.slots();
  replays_seen_.assign(w, 0);
  replays_announced_.assign(w, -1);
  bool fresh = true;
  {
    ReaderMutexLock map_lock(table_->mu());
    for (Slice* s : table_->All()) {
      MutexLock lock(&s->mu);
      if (s->complete != 0 || s->pushes != 0) fresh = false;
    }
  }
  if (!fresh) {
    // A live server (a worker's connection broke, the server did not): replays only fill in
    // pushes that may have been lost on the way.
    phase_ = Phase::kOver;
    TLOG_INFO << "replays on a live server: treated as pushes not yet counted";
    return;
  }
  const std::string who = "server " + std::to_string(config_.server_rank);
  if (config_.mode == ServerMode::kUpdate) {
    // The weights live only here: they come back from the newest checkpoint, the replayed
    // steps are applied on top (the steps in between are lost on this server's slices).
    if (config_.checkpoint_path.empty()) {
      error_ = FailedPreconditionError(
          who + " restarted in update mode but the job has no checkpoint.path: its weights are "
                "lost and the job cannot continue (set spec.checkpoint to recover from the "
                "newest checkpoint)");
    } else {
      std::string file;
      int64_t step = 0;
      Status st = checkpoints_->RestoreNewest(&file, &step);
      if (!st.ok()) {
        error_ = FailedPreconditionError(
            who + " restarted in update mode and cannot reload its weights: " + st.ToString());
      } else {
        TLOG_INFO << "restarted: reloaded " << file << " (step " << step
                  << "); replayed steps are applied on top";
      }
    }
    if (!error_.ok()) {
      TLOG_ERROR << error_.ToString();
      phase_ = Phase::kOver;
      return;
    }
  }
  ReaderMutexLock map_lock(table_->mu());
  for (Slice* s : table_->All()) {
    MutexLock lock(&s->mu);
    s->rebuild = std::make_unique<ReplayedSteps>();
    s->rebuild->restored_step = s->weights.step_base;
    // Worker steps count the optimizer's steps again (docs/checkpoints.md).
    s->weights.step_base = 0;
  }
  phase_ = Phase::kRebuilding;
  TLOG_INFO << who << ": fresh and receiving replays: rebuilding " << table_->num_slices()
            << " slices";
}

void SliceRebuild::HandleReplay(int32_t worker, const wire::RequestHeader& h,
                                const wire::Chunks& frame, StoreReply reply) {
  std::vector<DeferredReply> deferred;
  Status st;
  {
    MutexLock rebuild_lock(&mu_);
    {
      ReaderMutexLock map_lock(table_->mu());
      if (!table_->installed()) {
        st = FailedPreconditionError("replay before the shard map was installed on server " +
                                     std::to_string(config_.server_rank));
      }
    }
    if (st.ok() && phase_ == Phase::kNotSeen) StartLocked();
    if (st.ok()) st = error_;
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
      ReaderMutexLock map_lock(table_->mu());
      Slice* s = st.ok() ? table_->Find(h.key, h.slice) : nullptr;
      if (st.ok() && s == nullptr) st = table_->Describe404(h.key, h.slice);
      std::vector<uint8_t> scratch;
      CodedFrame coded;
      if (st.ok()) st = protocol_->CheckPayload(*s, ih, inner, &scratch, &coded);
      if (st.ok()) {
        const Gradient grad{&inner, wire::IsTwoBit(ih.op) ? &coded : nullptr};
        MutexLock lock(&s->mu);
        ++replays_seen_[worker];
        if (s->rebuild) {
          Request(worker, s, ih, grad, nullptr, &deferred);
        } else if (phase_ == Phase::kOver && ih.step == s->complete + 1 && !s->pushed[worker]) {
          // A live server that never got this push (it was lost with the connection).
          st = protocol_->Push(worker, s, ih, grad, &deferred);
        }  // else: already counted
      }
    }
    if (st.ok()) FinishIfReplayedLocked(&deferred);
  }
  if (!st.ok()) series_->RequestFailed();
  reply(st, Answer{});
  RunDeferred(&deferred);
}

void SliceRebuild::Request(int32_t worker, Slice* s, const wire::RequestHeader& h,
                           const Gradient& grad, StoreReply reply,
                           std::vector<DeferredReply>* out) {
  if (wire::OpHasPayload(h.op)) {  // a push or pushpull, float32 or 2-bit
    auto& per_worker = s->rebuild->steps[h.step];
    per_worker.resize(config_.slots());
    // A worker's duplicate (replayed and sent again) counts once; one outside the slice's world
    // not at all.
    if (!per_worker[worker] && s->world->Has(worker)) {
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
    series_->PullWaiting();
  }
}

void SliceRebuild::FinishIfReplayedLocked(std::vector<DeferredReply>* out) {
  if (phase_ != Phase::kRebuilding) return;
  const std::shared_ptr<const World> world = worlds_->Current();
  for (int32_t w = 0; w < config_.slots(); ++w) {
    if (!world->Has(w) || lost_.count(w)) continue;
    if (replays_announced_[w] < 0 || replays_seen_[w] < replays_announced_[w]) return;
  }
  FinishLocked(out);
}

void SliceRebuild::Lose(int32_t slot) {
  std::vector<DeferredReply> deferred;
  {
    MutexLock lock(&mu_);
    if (!lost_.insert(slot).second) return;
    FinishIfReplayedLocked(&deferred);
  }
  RunDeferred(&deferred);
}

void SliceRebuild::FinishLocked(std::vector<DeferredReply>* out) {
  int64_t rebuilt = 0;
  {
    ReaderMutexLock map_lock(table_->mu());
    for (Slice* s : table_->All()) {
      MutexLock lock(&s->mu);
      if (!s->rebuild) continue;
      FinalizeSlice(s, out);
      ++rebuilt;
    }
  }
  phase_ = Phase::kOver;
  series_->SlicesRebuilt(rebuilt);
  TLOG_INFO << "server " << config_.server_rank << ": rebuilt " << rebuilt
            << " slices from the workers' replays";
}

void SliceRebuild::FinalizeSlice(Slice* s, std::vector<DeferredReply>* out) {
  auto steps = std::move(s->rebuild->steps);
  const int64_t restored_step = s->rebuild->restored_step;
  s->rebuild.reset();
  const int64_t n = s->num_elements;
  // A lost worker's contributions are left out: it did not replay them all, so no step can
  // count on them. The rebuilt slice does not await it again.
  int32_t members = s->world->size;
  for (int32_t slot : lost_) {
    if (!s->world->Has(slot)) continue;
    --members;
    for (auto& [step, c] : steps) {
      if (static_cast<size_t>(slot) < c.size()) c[slot].reset();
    }
  }
  // Every member of the slice's world but the lost contributed (Request keeps members' only).
  auto full = [members](int64_t, const std::vector<std::unique_ptr<std::vector<float>>>& c) {
    return static_cast<int32_t>(std::count_if(c.begin(), c.end(), [](const auto& g) {
             return g != nullptr;
           })) == members;
  };
  auto sum_of = [n](const std::vector<std::unique_ptr<std::vector<float>>>& c) {
    auto sum = std::make_unique<std::vector<float>>(n, 0.0f);
    for (const auto& g : c) {
      if (!g) continue;
      for (size_t i = 0; i < sum->size(); ++i) (*sum)[i] += (*g)[i];
    }
    return sum;
  };
  const bool update = config_.mode == ServerMode::kUpdate;
  if (!steps.empty() && update && !s->initialized) {
    for (auto& wt : s->waiters) {
      series_->PullAnswered();
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
      if (full(step, c)) complete = step;
    }
    complete = std::max<int64_t>(complete, 0);
    // Else keep step 0 (a broadcast that came during the rebuild). Rebuilt results are answered
    // as float32.
    if (complete > 0) s->results.Forget();
    for (int64_t step : {complete - 1, complete}) {
      auto it = steps.find(step);
      if (step < 1 || it == steps.end() || !full(step, it->second)) continue;
      if (update && step <= restored_step) continue;  // already in the reloaded weights
      auto sum = sum_of(it->second);
      s->results.Keep(step, update_->Apply(step, members, &sum, &s->weights), 0);
    }
    if (update && complete > 0 && !s->results.Get(complete)) {
      // Nothing of that step survived: its weights are the newest ones this server has.
      s->results.Keep(complete, std::make_shared<const std::vector<float>>(s->weights.values), 0);
    }
    s->complete = complete;
    s->pushes = 0;
    s->step_threshold = 0;  // the rebuilt accumulator is answered as float32 too
    std::fill(s->pushed.begin(), s->pushed.end(), false);
    s->accum.reset();
    if (auto it = steps.find(complete + 1); it != steps.end()) {
      s->accum = sum_of(it->second);
      for (size_t i = 0; i < it->second.size(); ++i) {
        if (it->second[i]) {
          s->pushed[i] = true;
          ++s->pushes;
        }
      }
    }
    if (!update && complete > 0) s->initialized = true;
  }
  for (int32_t slot : lost_) {
    if (s->world->Has(slot)) s->gone.emplace(slot, s->complete + 1);
  }
  // Pulls that came during the rebuild: answered now, or still waiting for complete+1.
  std::vector<Waiter> waiting = std::move(s->waiters);
  s->waiters.clear();
  for (auto& wt : waiting) {
    if (StepProtocol::Waits(*s, wt.step)) {
      s->waiters.push_back(std::move(wt));
      continue;
    }
    series_->PullAnswered();
    if (Values v = s->results.Get(wt.step)) {
      out->push_back({std::move(wt.reply), Status::Ok(), std::move(v),
                      protocol_->PackedAnswer(s, wt.step, wt.packed)});
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
