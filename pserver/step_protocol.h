// The synchronous step protocol on one slice (docs/architecture.md, "Parameter server").
//
// `complete` is the latest step whose result is final (0 = the initial value, set by an INIT
// from the root worker). A push is accepted only for step complete+1, once per worker and only
// from a member of the slice's world (pserver/world_schedule.h); when all members have pushed,
// the step completes and its result (pserver/step_update.h) is kept with the previous one's. A pull of step complete+1 waits; a pull of a kept step is answered at
// once; anything else is OUT_OF_RANGE. A worker that restarted and rejoined (kRejoin;
// docs/checkpoints.md, Crash recovery) may push steps its dead incarnation already pushed: those
// are no-ops.
//
// Every call here runs under the slice's lock and leaves the replies it decided in `out`, to be
// run once the lock is released.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/status.h"
#include "datapath/codec/coded_frame.h"
#include "datapath/frame.h"
#include "pserver/pserver_metrics.h"
#include "pserver/slice.h"
#include "pserver/step_update.h"
#include "pserver/store_config.h"

namespace trellis {

// A push's gradient: float32 values in the frame, or a validated 2-bit or 16-bit frame.
struct Gradient {
  const wire::Chunks* frame = nullptr;  // values from byte wire::kRequestHeaderBytes on
  const CodedFrame* coded = nullptr;    // set for the 2-bit ops (points into the request)
  std::vector<float>* owner = nullptr;  // SliceStore::Handle's `payload`: the values, swappable
};

class StepProtocol {
 public:
  StepProtocol(const StoreConfig& config, const StepUpdate* update, PserverMetrics* series)
      : mode_(config.mode), update_(update), series_(series) {}

  // Checks a request's payload against the slice before any lock is taken: the float count, or
  // the whole 2-bit or 16-bit frame (count = the slice's elements). *coded then points into
  // `frame` or *scratch.
  Status CheckPayload(const Slice& s, const wire::RequestHeader& h, const wire::Chunks& frame,
                      std::vector<uint8_t>* scratch, CodedFrame* coded) const;

  // INIT: the step-0 value (a broadcast from the root); wakes the pulls of step 0.
  Status Init(Slice* s, const wire::Chunks& frame, std::vector<DeferredReply>* out) REQUIRES(s->mu);
  // A push of step h.step by `worker`; the one that completes the step wakes its pulls.
  Status Push(int32_t worker, Slice* s, const wire::RequestHeader& h, const Gradient& grad,
              std::vector<DeferredReply>* out) REQUIRES(s->mu);
  // Worker `slot` is lost for good (docs/elastic.md#losing-a-worker): from the slice's first step
  // it did not push on, the steps complete without it, the step in progress at once when every
  // other member pushed it. No-op when already lost.
  void Lose(int32_t slot, Slice* s, std::vector<DeferredReply>* out) REQUIRES(s->mu);
  // Brings `slot` back (a later world names it again): counted from the slice's next step.
  static void Unlose(int32_t slot, Slice* s) REQUIRES(s->mu) { s->gone.erase(slot); }
  // How many pushes complete `step`: the world's members but those lost before it.
  static int32_t Needed(const Slice& s, int64_t step) REQUIRES(s.mu);
  // `packed`: the request accepts a packed answer. Answered now or when the step completes.
  void Pull(Slice* s, int64_t step, bool packed, StoreReply reply, std::vector<DeferredReply>* out)
      REQUIRES(s->mu);
  // Whether a pull of `step` waits (for step complete+1, or for step 0 before its broadcast).
  static bool Waits(const Slice& s, int64_t step) REQUIRES(s.mu) {
    return step == s.complete + 1 || (step == 0 && !s.initialized && s.complete == 0);
  }
  // The packed answer of a kept step for a request that accepts one, else null.
  Packed PackedAnswer(Slice* s, int64_t step, bool packed) REQUIRES(s->mu) {
    return packed ? s->results.PackedFor(step) : nullptr;
  }

 private:
  // Step complete+1 has every push it needs: its result, and the pulls waiting for it.
  void Complete(Slice* s, std::vector<DeferredReply>* out) REQUIRES(s->mu);

  const ServerMode mode_;
  const StepUpdate* const update_;
  PserverMetrics* const series_;
};

}  // namespace trellis
