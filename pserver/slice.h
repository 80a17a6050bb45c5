// One slice held by this server: its identity, and the state of the synchronous step protocol
// (pserver/step_protocol.h) under the slice's own lock, so requests on different slices run in
// parallel. Also what the store's parts answer with: replies run once no store lock is held.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "pserver/optimizer.h"
#include "pserver/world_schedule.h"

namespace trellis {

using Values = std::shared_ptr<const std::vector<float>>;
// A packed answer (datapath/codec/packed_sum.h), immutable and shared like Values.
using Packed = std::shared_ptr<const std::vector<uint8_t>>;
// What a pull is answered with: the step's values, and for a request that accepts a packed
// answer (wire::AcceptsPacked) whose step qualifies, their packed form, which is what goes on
// the wire then.
struct Answer {
  Values values;
  Packed packed;
};
// Answer to one request: a status, and for pulls the step's values. Called exactly once.
using StoreReply = std::function<void(const Status&, Answer)>;

// A reply decided under a slice lock, run after it is released.
struct DeferredReply {
  StoreReply reply;
  Status status;
  Values values;
  Packed packed;
};

// A pull that waits for its step.
struct Waiter {
  int64_t step;
  bool packed;  // the request accepts a packed answer
  StoreReply reply;
};

// The results of the last two complete steps, [s % 2] for s in {complete-1, complete} (a fast
// worker may push s+1 while a slow one has not pulled s yet). Results are immutable shared
// buffers, so an answer can reference them without copying while the slice moves on.
class KeptResults {
 public:
  Values Get(int64_t step) const {
    const int i = static_cast<int>(step % 2);
    return step_[i] == step ? results_[i] : nullptr;
  }
  // Keeps `values` as the result of `step` in place of step-2's, which it returns. `packable`:
  // the threshold t when the result is a sum of `pushers` 2-bit pushes of that one threshold
  // (aggregate mode), so that it can be packed; else 0.
  Values Keep(int64_t step, Values values, float packable, int32_t pushers = 0) {
    const int i = static_cast<int>(step % 2);
    Values old = std::move(results_[i]);
    results_[i] = std::move(values);
    step_[i] = step;
    packable_[i] = pushers > 0 ? packable : 0;
    pushers_[i] = pushers;
    packed_[i] = nullptr;
    return old;
  }
  // Step 0's value (a broadcast or a restored checkpoint) and nothing else.
  void Restart(Values step0) {
    Keep(0, std::move(step0), 0);
    results_[1] = nullptr;
    step_[1] = -1;
  }
  void Forget() {
    for (int i = 0; i < 2; ++i) {
      results_[i] = nullptr;
      step_[i] = -1;
      packable_[i] = 0;
      packed_[i] = nullptr;
    }
  }
  // The packed form of the kept result of `step` (made once, here), or null when that result is
  // not a sum of 2-bit pushes of one threshold or cannot be packed (the answer is float32).
  Packed PackedFor(int64_t step);

 private:
  Values results_[2];
  int64_t step_[2] = {-1, -1};
  float packable_[2] = {0, 0};
  int32_t pushers_[2] = {0, 0};
  Packed packed_[2];  // made at the first request that accepts one
};

// A slice's model in update mode: what a checkpoint holds of it (pserver/step_update.h applies
// a step to it).
struct SliceWeights {
  std::vector<float> values;
  OptimizerState opt;
  int64_t step_base = 0;  // optimizer steps before a restore: the optimizer's step is base + step
};

// One slice's replayed contributions while the store rebuilds (pserver/slice_rebuild.h).
struct ReplayedSteps {
  // step -> per worker: the dequantized gradient, or null while that worker's is missing.
  std::map<int64_t, std::vector<std::unique_ptr<std::vector<float>>>> steps;
  // Update mode: the step of the reloaded checkpoint's weights; replayed steps up to it are
  // already in them and are not applied again.
  int64_t restored_step = 0;
};

// Crash recovery of a worker (pserver/slice_rejoin.cc, docs/checkpoints.md): which workers
// rejoined, and the values a donor stashed for a rejoiner.
struct RejoinState {
  // Per worker: it restarted and rejoined (kRejoin) and has not made a push here that counts
  // yet. Empty: none.
  std::vector<bool> rejoined;
  // Values donors put here for rejoins (id -> values), apart from the step protocol, until
  // fetched, oldest first. Several at once: a grow brings in several joiners together.
  std::deque<std::pair<uint64_t, Values>> stashes;

  void Mark(int32_t worker, int32_t num_workers);
  // Stashes `v` for rejoin `id` (replacing that id's), dropping the oldest beyond `limit`.
  void Put(uint64_t id, Values v, size_t limit);
  // Whether a push of `step` by `worker` is one the slice already counted from the worker's
  // previous incarnation (answered OK without adding). A push that counts clears the mark.
  bool PushIsNoOp(int32_t worker, int64_t step, int64_t complete, bool pushed_this_step);
  // The stash of rejoin `id`, taken (fetched once: the memory goes with the answer); NOT_FOUND
  // naming `slice` (and the rejoins it holds) when there is none.
  StatusOr<Values> Fetch(uint64_t id, const std::string& slice);
};

// A server resize (pserver/slice_handover.h): the slice moving between servers.
struct SliceMove {
  // On the new owner: made by the resize's map (or fresh on a server the resize started), it
  // answers nothing but kHandIn from its first hand-in (or from the map, `from_server`) until
  // every part of its state arrived. -1: the map did not move it here.
  int32_t from_server = -1;
  uint32_t parts_in = 0;      // a bit per wire::HandoverPart that arrived
  uint32_t parts_needed = 0;  // known once part kState arrived (0 until then)
  int64_t handed_in_at = -1;  // the step the arrived state completed
  // On the old owner, once the resize's map gave the slice to `to_server` (-1: not moved away):
  // the parts each worker took (per slot, a bit per part). Once every member of the slice's world
  // took every part, the state is freed (`released`).
  int32_t to_server = -1;
  std::vector<uint32_t> handed_out;
  bool released = false;

  bool MovingIn() const {
    return parts_needed != 0 ? parts_in != parts_needed : from_server >= 0;
  }
};

struct Slice {
  // `world`: the workers its steps count from now on (world_schedule.h); `slots` of them at most.
  Slice(uint64_t key, uint32_t index, std::string name, int64_t num_elements, int32_t slots,
        std::shared_ptr<const World> world)
      : key(key), index(index), name(std::move(name)), num_elements(num_elements),
        world(std::move(world)), pushed(slots, false) {}

  const uint64_t key;
  const uint32_t index;
  const std::string name;  // "key 7 (fc1.weight) slice 2", for messages
  const int64_t num_elements;

  Mutex mu;
  // The workers whose pushes make step complete+1 and the next ones (the store gives it a new
  // world before any push of its next step: world_schedule.h).
  std::shared_ptr<const World> world GUARDED_BY(mu);
  int64_t complete GUARDED_BY(mu) = 0;  // the latest step whose result is final
  bool initialized GUARDED_BY(mu) = false;  // step 0's value present
  KeptResults results GUARDED_BY(mu);
  // The sum of step complete+1 so far, who pushed it, and the threshold of every push of it when
  // all were 2-bit frames of one threshold (0 once one was not).
  std::unique_ptr<std::vector<float>> accum GUARDED_BY(mu);
  std::vector<bool> pushed GUARDED_BY(mu);  // per worker
  int32_t pushes GUARDED_BY(mu) = 0;
  // The workers lost for good (SliceStore::LoseWorker) -> the first step they are not waited for.
  // Empty but for a loss: a push looks here, so it costs nothing per slot.
  std::map<int32_t, int64_t> gone GUARDED_BY(mu);
  float step_threshold GUARDED_BY(mu) = 0;
  SliceWeights weights GUARDED_BY(mu);  // update mode
  std::vector<Waiter> waiters GUARDED_BY(mu);
  std::unique_ptr<ReplayedSteps> rebuild GUARDED_BY(mu);  // set while the store rebuilds
  RejoinState rejoin GUARDED_BY(mu);
  SliceMove move GUARDED_BY(mu);
};

}  // namespace trellis
