// Crash recovery of a worker on the server (docs/checkpoints.md#crash-recovery-workers). A
// restarted worker gets a live worker's last commit (step c) through the stash of every slice
// (kStash by the donor, kFetch by the rejoiner), then sends kRejoin and pushes every key from
// step c+1 on.
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
#include "pserver/slice.h"

#include <algorithm>

namespace trellis {

void RejoinState::Mark(int32_t worker, int32_t num_workers) {
  if (rejoined.empty()) rejoined.assign(num_workers, false);
  rejoined[worker] = true;
}

bool RejoinState::PushIsNoOp(int32_t worker, int64_t step, int64_t complete,
                             bool pushed_this_step) {
  if (rejoined.empty() || !rejoined[worker]) return false;
  const bool counted = step <= complete || (step == complete + 1 && pushed_this_step);
  if (!counted) rejoined[worker] = false;  // from here on the worker is an ordinary one
  return counted;
}

void RejoinState::Put(uint64_t id, Values v, size_t limit) {
  for (auto it = stashes.begin(); it != stashes.end(); ++it) {
    if (it->first == id) {
      stashes.erase(it);
      break;
    }
  }
  stashes.emplace_back(id, std::move(v));
  while (stashes.size() > std::max<size_t>(limit, 1)) stashes.pop_front();
}

StatusOr<Values> RejoinState::Fetch(uint64_t id, const std::string& slice) {
  for (auto it = stashes.begin(); it != stashes.end(); ++it) {
    if (it->first != id) continue;
    Values v = std::move(it->second);  // fetched once: the memory goes with the answer
    stashes.erase(it);
    return v;
  }
  // The scheduler answers a rejoiner only after its donor stashed every slice, so a missing
  // stash means newer rejoins pushed it out (or a confused peer): say which it holds.
  std::string held;
  for (const auto& [other, values] : stashes) held += (held.empty() ? "" : ", ") + std::to_string(other);
  return NotFoundError(slice + ": nothing stashed for rejoin " + std::to_string(id) +
                       (held.empty() ? "" : " (the stash holds rejoin " + held + ")"));
}

}  // namespace trellis
