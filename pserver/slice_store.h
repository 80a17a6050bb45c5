// The parameter server's state without any networking: the slices this server holds and, per
// slice, the synchronous step protocol. SliceStore takes each decoded request and hands it to
// the part whose idea it is:
//
//   SliceTable        slice_table.h        the shard map installed, the slices held here
//   StepProtocol      step_protocol.h      init, push, pull on one slice
//   StepUpdate        step_update.h        a complete step's result: sum, or mean + optimizer
//   SliceCheckpoints  slice_checkpoints.h  SAVE and LOAD of the slices (update mode)
//   SliceRebuild      slice_rebuild.h      a restarted server, rebuilt from the workers' replays
//   RejoinState       slice.h              a restarted worker's stash and no-op pushes
//   WorldSchedule     world_schedule.h     which workers take part in each step (kWorld)
//   SliceHandover     slice_handover.h     a server resize: moved slices' state, old to new owner
//
// Thread-safe: one lock per slice, so requests on different slices run in parallel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_dir.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "datapath/frame.h"
#include "pserver/pserver_metrics.h"
#include "pserver/slice.h"
#include "pserver/slice_checkpoints.h"
#include "pserver/slice_handover.h"
#include "pserver/slice_rebuild.h"
#include "pserver/slice_table.h"
#include "pserver/step_protocol.h"
#include "pserver/step_update.h"
#include "pserver/store_config.h"
#include "pserver/world_schedule.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

class SliceStore {
 public:
  explicit SliceStore(StoreConfig config);
  ~SliceStore();
  SliceStore(const SliceStore&) = delete;
  SliceStore& operator=(const SliceStore&) = delete;

  // Rejoins a slice holds stashes for at once (bounded by the job's worker slots too).
  static constexpr size_t kMaxStashes = 32;

  const StoreConfig& config() const { return config_; }

  // Keeps the slices of `map` assigned to this server (SliceTable::Install).
  Status Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes);

  // Handles one decoded request from `worker`; the payload is `frame` from byte
  // wire::kRequestHeaderBytes on. `reply` runs exactly once, never under a store lock: inline
  // when the answer is known, or later from the call that completes the step.
  // REQUIRES: 0 <= worker < config().slots(); h passed wire::DecodeRequest.
  //
  // `payload` (optional): the buffer that holds exactly this request's float32 payload, owned by
  // the caller (the TCP reader's reused buffer). For a push that is the step's first
  // contribution the store may swap it with the slice's spare accumulator of the same size
  // instead of copying the values (a 4 MiB memcpy per slice): the caller then finds another
  // buffer of the same size in `payload` and reads its next request into that.
  void Handle(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
              StoreReply reply, std::vector<float>* payload = nullptr);

  // Fails every waiting pull with `status` (shutdown).
  void FailWaiters(const Status& status);

  // Latest complete step of a slice, or -1 if unknown (tests, metrics).
  int64_t CompleteStep(uint64_t key, uint32_t slice) const;

  // Checkpoints (SliceCheckpoints).
  Checkpoint Snapshot(int64_t step, uint64_t skip_key) const {
    return checkpoints_.Snapshot(step, skip_key);
  }
  Status RestoreFrom(const Checkpoint& c, const std::string& file) {
    return checkpoints_.RestoreFrom(c, file);
  }

  // Whether a rebuild from replays is under way (tests).
  bool Rebuilding() const { return rebuild_.Rebuilding(); }

  const WorldSchedule& worlds() const { return worlds_; }

  // Worker `slot` was lost for good, left out of world `epoch` (the scheduler's pings:
  // v1::LostWorker; docs/elastic.md#losing-a-worker): no slice waits for its pushes from its
  // first step the worker did not push, and steps it alone held up complete now. Repeats change
  // nothing; a world newer than `epoch` that names the slot brings it back (kWorld).
  // INVALID_ARGUMENT: a slot out of range.
  Status LoseWorker(int32_t slot, int64_t epoch) EXCLUDES(world_install_mu_);

  // A server resize removed this server: the installed map (of a resize's world) gives it no
  // slice and every slice it moved away was taken by every worker. Its program may then exit
  // (docs/elastic.md#servers). Returns the installed map's world epoch then, else 0.
  int64_t ResizedAway() const;

 private:
  // kRejoin: marks `worker` rejoined on every slice (crash recovery of a worker).
  Status MarkRejoined(int32_t worker);
  // kWorld from `worker`: the world of epoch h.step its payload names, on every slice from its
  // next step (world_schedule.h), announced by one of its members before it pushes again.
  Status AddWorld(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame);
  // Runs the replies decided under the slice locks (none held), counting them.
  void RunReplies(std::vector<DeferredReply>* deferred);
  // kStash and kFetch: a donor's values for a rejoiner, apart from the step protocol.
  void Stash(Slice* s, const wire::RequestHeader& h, const wire::Chunks& frame) REQUIRES(s->mu);
  void Fetch(Slice* s, const wire::RequestHeader& h, StoreReply reply,
             std::vector<DeferredReply>* out) REQUIRES(s->mu);

  const StoreConfig config_;
  const std::shared_ptr<MetricsRegistry> registry_;  // config_.metrics or the store's own
  PserverMetrics series_;
  WorldSchedule worlds_;
  Mutex world_install_mu_;  // one kWorld installation or loss at a time (AddWorld, LoseWorker)
  std::map<int32_t, int64_t> lost_ GUARDED_BY(world_install_mu_);  // slot -> the epoch without it
  SliceTable table_;
  const StepUpdate update_;
  StepProtocol protocol_;
  SliceCheckpoints checkpoints_;
  SliceRebuild rebuild_;
  SliceHandover handover_;
};

}  // namespace trellis
