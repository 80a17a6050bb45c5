// SliceStore: crash recovery of a worker (docs/checkpoints.md#crash-recovery-workers). A restarted worker
// gets a live worker's last commit (step c) through the stash of every slice, then sends kRejoin
// and pushes every key from step c+1 on.
//
// Why the slices' window always covers c+1 for the rejoiner. The donor committed c, so it waited
// for every slice of step c: complete >= c everywhere. A slice completes step t only with the
// donor's push of t, and the donor pushes t only after committing t-1. The dead incarnation
// died before the rejoin was asked for, so before the donor took the snapshot c: by then the
// donor had pushed at most c+1, so the dead incarnation completed at most step c+1 and pushed at
// most step c+2. Without the rejoiner no slice can complete c+3. So c <= complete <= c+2 on
// every slice until the rejoiner pushes c+3, and its pulls of c+1 and c+2 fall in the kept
// window [complete-1, complete+1]. Its pushes of c+1 and c+2 may have been counted already (the
// dead incarnation pushed them, from the very parameters the rejoiner now holds): those are
// no-ops; the others count as usual.
#include "pserver/slice_store.h"

namespace trellis {

Status SliceStore::MarkRejoined(int32_t worker) {
  std::shared_lock map_lock(map_mu_);
  if (installed_.empty()) {
    return FailedPreconditionError("rejoin of worker " + std::to_string(worker) +
                                   ": no shard map installed on server " +
                                   std::to_string(config_.server_rank) + " yet");
  }
  for (auto& [id, slices] : keys_) {
    for (auto& [i, s] : slices) {
      std::lock_guard lock(s->mu);
      if (s->rejoined.empty()) s->rejoined.assign(config_.num_workers, false);
      s->rejoined[worker] = true;
    }
  }
  return Status::Ok();
}

bool SliceStore::RejoinPushIsNoOp(int32_t worker, Slice* s, int64_t step) {
  if (s->rejoined.empty() || !s->rejoined[worker]) return false;
  const bool counted = step <= s->complete || (step == s->complete + 1 && s->pushed[worker]);
  if (!counted) s->rejoined[worker] = false;  // from here on the worker is an ordinary one
  return counted;
}

void SliceStore::Stash(Slice* s, const wire::RequestHeader& h, const wire::Chunks& frame) {
  // The payload's length was checked against the slice (CheckPayload). A new stash replaces the
  // old one: one rejoin at a time per slice is all a job needs, and memory stays bounded.
  auto v = std::make_shared<std::vector<float>>(s->num_elements);
  wire::CopyFloats(frame, wire::kRequestHeaderBytes, s->num_elements, v->data());
  s->stash = std::move(v);
  s->stash_id = static_cast<uint64_t>(h.step);
}

void SliceStore::Fetch(Slice* s, const wire::RequestHeader& h, Reply reply,
                       std::vector<Deferred>* out) {
  const uint64_t id = static_cast<uint64_t>(h.step);
  if (!s->stash || s->stash_id != id) {
    // The scheduler answers a rejoiner only after its donor stashed every slice, so a missing
    // stash means another rejoin replaced it (or a confused peer): say which.
    out->push_back({std::move(reply),
                    NotFoundError(s->name + ": nothing stashed for rejoin " + std::to_string(id) +
                                  (s->stash ? " (the stash holds rejoin " +
                                                  std::to_string(s->stash_id) + ")"
                                            : "")),
                    nullptr, nullptr});
    return;
  }
  Values v = std::move(s->stash);  // fetched once: the memory goes with the answer
  s->stash_id = 0;
  out->push_back({std::move(reply), Status::Ok(), std::move(v), nullptr});
}

}  // namespace trellis
