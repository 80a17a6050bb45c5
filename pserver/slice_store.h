// The parameter server's state without any networking: the slices this server holds and, per
// slice, the synchronous step protocol.
//
// Per slice: `complete` is the latest step whose result is final (0 = the initial value, set by
// an INIT from the root worker). A push is accepted only for step complete+1, once per worker;
// when all W workers have pushed, the step completes: `aggregate` mode publishes the sum,
// `update` mode applies the optimizer to sum/W and publishes the new weights. Results of the
// last two complete steps are kept (a fast worker may push s+1 while a slow one has not pulled
// s yet). A pull of step complete+1 waits; a pull of a kept step is answered at once; anything
// else is OUT_OF_RANGE. A worker that restarted and rejoined (kRejoin; docs/checkpoints.md,
// Crash recovery) may push steps its dead incarnation already pushed: those are no-ops. Results are immutable shared buffers, so a response can reference them
// without copying while the slice moves on.
//
// Crash recovery (slice_store_rebuild.cc, docs/checkpoints.md): a restarted server is fresh;
// the workers reconnect and replay their last two pushes of every slice (wire::Op::kReplay).
// The first replay on a fresh store starts a rebuild: every slice collects contributions per step
// and worker, pulls wait; when all W workers ended their replays, each slice's highest step with
// all W contributions becomes `complete`, the next step's contributions its accumulator.
//
// Thread-safe: one lock per slice, so requests on different slices run in parallel.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/job/job_spec.h"
#include "common/metrics/metrics.h"
#include "common/base/status.h"
#include "pserver/optimizer.h"
#include "pserver/pserver_metrics.h"
#include "datapath/frame.h"
#include "datapath/codec/coded_frame.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

struct StoreConfig {
  int32_t server_rank = 0;
  int32_t num_workers = 1;
  ServerMode mode = ServerMode::kAggregate;
  OptimizerSpec optimizer;
  // The process's metrics (role server); null: the store keeps its own.
  std::shared_ptr<MetricsRegistry> metrics;
  std::string checkpoint_path;  // the job's spec.checkpoint.path; empty: SAVE/LOAD refused
  int32_t checkpoint_keep = 3;
};

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
using Reply = std::function<void(const Status&, Answer)>;

class SliceStore {
 public:
  explicit SliceStore(StoreConfig config);
  ~SliceStore();
  SliceStore(const SliceStore&) = delete;
  SliceStore& operator=(const SliceStore&) = delete;

  const StoreConfig& config() const { return config_; }

  // Keeps the slices of `map` assigned to this server. Installing an equal map again is a no-op;
  // a map that adds keys to the installed one (deferred init: same settings, every installed key
  // laid out the same) adds their slices; any other is FAILED_PRECONDITION (every worker relays
  // the same scheduler map).
  Status Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes);

  // Handles one decoded request from `worker`; the payload is `frame` from byte
  // wire::kRequestHeaderBytes on. `reply` runs exactly once, never under a store lock: inline
  // when the answer is known, or later from the call that completes the step.
  // REQUIRES: 0 <= worker < num_workers; h passed wire::DecodeRequest.
  //
  // `payload` (optional): the buffer that holds exactly this request's float32 payload, owned by
  // the caller (the TCP reader's reused buffer). For a push that is the step's first
  // contribution the store may swap it with the slice's spare accumulator of the same size
  // instead of copying the values (a 4 MiB memcpy per slice): the caller then finds another
  // buffer of the same size in `payload` and reads its next request into that.
  void Handle(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame, Reply reply,
              std::vector<float>* payload = nullptr);

  // Fails every waiting pull with `status` (shutdown).
  void FailWaiters(const Status& status);

  // Latest complete step of a slice, or -1 if unknown (tests, metrics).
  int64_t CompleteStep(uint64_t key, uint32_t slice) const;

  // Checkpoints (slice_store_checkpoint.cc). Snapshot: in update mode every initialized slice
  // held here (weights, optimizer state, optimizer step count), except those of `skip_key`;
  // in aggregate mode nothing. RestoreFrom installs a snapshot as the slices' step-0 values
  // (pulled like a broadcast) with their optimizer state; everything is checked first, so a
  // file that does not fit this shard map changes nothing. Entries of keys absent from the map
  // (declared late in the saving run) are left out. Errors name `file`.
  Checkpoint Snapshot(int64_t step, uint64_t skip_key) const;
  Status RestoreFrom(const Checkpoint& c, const std::string& file);

  // Whether a rebuild from replays is under way (tests).
  bool Rebuilding() const;

 private:
  // One slice's replayed contributions while the store rebuilds (slice_store_rebuild.cc).
  struct Rebuild {
    // step -> per worker: the dequantized gradient, or null while that worker's is missing.
    std::map<int64_t, std::vector<std::unique_ptr<std::vector<float>>>> steps;
    // Update mode: the step of the reloaded checkpoint's weights; replayed steps up to it are
    // already in them and are not applied again.
    int64_t restored_step = 0;
  };
  struct Waiter {
    int64_t step;
    bool packed;  // the request accepts a packed answer
    Reply reply;
  };
  struct Slice {
    uint64_t key = 0;
    uint32_t index = 0;
    std::string name;  // "key 7 (fc1.weight) slice 2", for messages
    int64_t num_elements = 0;

    std::mutex mu;
    int64_t complete = 0;               // GUARDED_BY(mu)
    bool initialized = false;           // GUARDED_BY(mu): step 0 value present
    Values results[2];                  // GUARDED_BY(mu): [s % 2] for s in {complete-1, complete}
    int64_t result_step[2] = {-1, -1};  // GUARDED_BY(mu)
    // GUARDED_BY(mu): per result, the threshold t when the result is a sum of 2-bit pushes of
    // that one threshold (aggregate mode), so it can be packed; else 0. packed[i] is its packed
    // form, made at the first request that accepts one.
    float packable[2] = {0, 0};
    Packed packed[2];
    // GUARDED_BY(mu): the threshold of every push of step complete+1 so far when all were 2-bit
    // frames of one threshold; 0 once one was not.
    float step_threshold = 0;
    std::unique_ptr<std::vector<float>> accum;  // GUARDED_BY(mu): sum of step complete+1
    std::vector<bool> pushed;           // GUARDED_BY(mu): per worker, for step complete+1
    int32_t pushes = 0;                 // GUARDED_BY(mu)
    std::vector<float> weights;         // GUARDED_BY(mu): update mode
    OptimizerState opt;                 // GUARDED_BY(mu)
    int64_t step_base = 0;              // GUARDED_BY(mu): optimizer steps before a restore
    std::vector<Waiter> waiters;        // GUARDED_BY(mu)
    std::unique_ptr<Rebuild> rebuild;   // GUARDED_BY(mu): set while the store rebuilds
    // Crash recovery (slice_store_rejoin.cc). rejoined[w]: worker w restarted and rejoined
    // (kRejoin) and has not made a push here that counts yet. The stash: values a donor put
    // here for rejoin `stash_id`, apart from the step protocol, until fetched or replaced.
    std::vector<bool> rejoined;         // GUARDED_BY(mu): per worker; empty: none
    uint64_t stash_id = 0;              // GUARDED_BY(mu)
    Values stash;                       // GUARDED_BY(mu): null: nothing stashed
  };
  // A push's gradient: float32 values in the frame, or a validated 2-bit or 16-bit frame.
  struct Gradient {
    const wire::Chunks* frame = nullptr;  // values from byte wire::kRequestHeaderBytes on
    const CodedFrame* coded = nullptr;    // set for the 2-bit ops (points into the request)
    std::vector<float>* owner = nullptr;  // Handle's `payload`: the values, swappable
  };
  struct Deferred {
    Reply reply;
    Status status;
    Values values;
    Packed packed;
  };

  Slice* Find(uint64_t key, uint32_t slice) const;  // REQUIRES: map_mu_ held
  Status CheckExtension(const v1::ShardMap& map) const;  // REQUIRES: map_mu_ held
  Status Describe404(uint64_t key, uint32_t slice) const;
  // Each returns replies to run after the slice lock is released.
  Status Push(int32_t worker, Slice* s, const wire::RequestHeader& h, const Gradient& grad,
              std::vector<Deferred>* out);
  // Checks a request's payload against the slice before any lock is taken: the float count, or
  // the whole 2-bit or 16-bit frame (count = the slice's elements). *coded then points into
  // `frame` or *scratch.
  Status CheckPayload(const Slice& s, const wire::RequestHeader& h, const wire::Chunks& frame,
                      std::vector<uint8_t>* scratch, CodedFrame* coded) const;
  Status Init(Slice* s, const wire::Chunks& frame, std::vector<Deferred>* out);
  // Crash recovery (slice_store_rejoin.cc). kRejoin: marks `worker` rejoined on every slice.
  Status MarkRejoined(int32_t worker);
  // Whether a push of `step` by a rejoined worker is one the slice already counted (from its
  // previous incarnation): answered OK without adding. A push that counts clears the mark.
  bool RejoinPushIsNoOp(int32_t worker, Slice* s, int64_t step);
  void Stash(Slice* s, const wire::RequestHeader& h, const wire::Chunks& frame);
  void Fetch(Slice* s, const wire::RequestHeader& h, Reply reply, std::vector<Deferred>* out);
  // `packed`: the request accepts a packed answer.
  void Pull(Slice* s, int64_t step, bool packed, Reply reply, std::vector<Deferred>* out);
  Values ResultFor(Slice* s, int64_t step) const;
  // The packed form of the kept result of `step` (made once, here), or null when that result
  // is not a sum of 2-bit pushes of one threshold or cannot be packed (the answer is float32).
  Packed PackedFor(Slice* s, int64_t step);
  CheckpointDir Dir() const;
  // SAVE: Snapshot to the checkpoint directory; LOAD: RestoreFrom the file of h.step.
  Status HandleCheckpointOp(const wire::RequestHeader& h);

  // Rebuild from replays (slice_store_rebuild.cc).
  void HandleReplay(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
                    Reply reply);
  // Push, pull or pushpull on a slice that is being rebuilt: a push is one more contribution, a
  // pull waits for the rebuild. REQUIRES: s->mu held, s->rebuild set.
  void RebuildRequest(int32_t worker, Slice* s, const wire::RequestHeader& h,
                      const Gradient& grad, Reply reply, std::vector<Deferred>* out);
  // Decides, at the first replay, whether this store rebuilds (it is fresh) or replays are
  // pushes that may have been lost on a live server. REQUIRES: rebuild_mu_ held, map_mu_ not.
  void StartRebuildLocked();
  // All workers ended their replays: every slice takes its rebuilt state.
  void FinishRebuildLocked(std::vector<Deferred>* out);  // REQUIRES: rebuild_mu_ held
  void FinalizeSlice(Slice* s, std::vector<Deferred>* out);  // REQUIRES: s->mu held
  // One step's sum over the contributions, or the update-mode weights after it.
  Values StepResult(Slice* s, int64_t step, std::vector<float>* sum);
  const StoreConfig config_;
  const std::shared_ptr<MetricsRegistry> registry_;  // config_.metrics or the store's own
  PserverMetrics series_;
  mutable std::shared_mutex map_mu_;
  std::string installed_;  // GUARDED_BY(map_mu_): serialized map, for the equality check
  // GUARDED_BY(map_mu_): key -> slice index -> the slices held here.
  std::unordered_map<uint64_t, std::unordered_map<uint32_t, std::unique_ptr<Slice>>> keys_;
  struct KeyInfo {
    std::string name;
    const v1::KeyShards* shards;  // points into map_
  };
  v1::ShardMap map_;                              // GUARDED_BY(map_mu_)
  std::unordered_map<uint64_t, KeyInfo> all_keys_;  // GUARDED_BY(map_mu_): every key of the map
  int64_t num_slices_ = 0;  // GUARDED_BY(map_mu_)

  // Rebuild from replays. Lock order: rebuild_mu_, then map_mu_, then a slice's mu.
  enum class RebuildPhase { kNotSeen, kRebuilding, kOver };
  mutable std::mutex rebuild_mu_;
  RebuildPhase rebuild_phase_ = RebuildPhase::kNotSeen;  // GUARDED_BY(rebuild_mu_)
  Status rebuild_error_;                          // GUARDED_BY(rebuild_mu_): refuses all replays
  std::vector<int64_t> replays_seen_;             // GUARDED_BY(rebuild_mu_): per worker
  std::vector<int64_t> replays_announced_;        // GUARDED_BY(rebuild_mu_): per worker, -1: not yet
};

}  // namespace trellis
