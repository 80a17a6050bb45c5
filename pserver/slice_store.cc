#include "pserver/slice_store.h"

#include <algorithm>
#include <utility>

#include "common/base/logging.h"

namespace trellis {

SliceStore::SliceStore(StoreConfig config)
    : config_(std::move(config)),
      registry_(config_.metrics ? config_.metrics
                                : std::make_shared<MetricsRegistry>(MetricLabels{"", "server", config_.server_rank})),
      series_(*registry_),
      worlds_(config_.slots(), config_.num_workers),
      table_(config_.server_rank, config_.slots(), &worlds_),
      update_(config_),
      protocol_(config_, &update_, &series_),
      checkpoints_(config_, &table_, &series_),
      rebuild_(config_, &worlds_, &table_, &protocol_, &update_, &checkpoints_, &series_),
      handover_(config_, &table_, &series_) {}
SliceStore::~SliceStore() { FailWaiters(CancelledError("parameter server shutting down")); }

Status SliceStore::Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes) {
  TRELLIS_RETURN_IF_ERROR(table_.Install(map, slices, bytes));
  series_.SlicesHeld(*slices, *bytes);
  return Status::Ok();
}

void SliceStore::Handle(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
                        StoreReply reply, std::vector<float>* payload) {
  if (h.op == wire::Op::kSave || h.op == wire::Op::kLoad) {
    reply(checkpoints_.HandleOp(h), Answer{});
    return;
  }
  if (wire::IsReplay(h.op)) {
    rebuild_.HandleReplay(worker, h, frame, std::move(reply));
    return;
  }
  if (h.op == wire::Op::kRejoin) {
    reply(MarkRejoined(worker), Answer{});
    return;
  }
  if (h.op == wire::Op::kWorld) {
    Status st = AddWorld(worker, h, frame);
    if (!st.ok()) series_.RequestFailed();
    reply(st, Answer{});
    return;
  }
  if (h.op == wire::Op::kHandOut) {
    handover_.HandOut(worker, h, frame, [this, reply = std::move(reply)](const Status& st, Answer a) {
      if (!st.ok()) series_.RequestFailed();
      reply(st, std::move(a));
    });
    return;
  }
  if (h.op == wire::Op::kHandIn) {
    Status st = handover_.HandIn(h, frame);
    if (!st.ok()) series_.RequestFailed();
    reply(st, Answer{});
    return;
  }
  std::vector<DeferredReply> deferred;
  Status st;
  series_.Request(h.op, wire::OpHasPayload(h.op) ? h.payload_bytes : 0);
  {
    ReaderMutexLock map_lock(table_.mu());
    Slice* s = table_.Find(h.key, h.slice);
    if (s == nullptr) {
      st = table_.Describe404(h.key, h.slice);
    } else {
      std::vector<uint8_t> scratch;  // a 2-bit or 16-bit frame split across chunks, gathered
      CodedFrame coded;
      st = protocol_.CheckPayload(*s, h, frame, &scratch, &coded);
      if (st.ok()) {
        const bool coded_op = wire::IsTwoBit(h.op);
        const Gradient grad{&frame, coded_op ? &coded : nullptr, coded_op ? nullptr : payload};
        MutexLock lock(&s->mu);
        if (s->move.MovingIn()) {
          st = SliceHandover::RefuseWhileMovingIn(*s);
        } else if (s->rebuild && h.op != wire::Op::kInit) {
          rebuild_.Request(worker, s, h, grad, std::move(reply), &deferred);
        } else switch (h.op) {
          case wire::Op::kInit:
            st = protocol_.Init(s, frame, &deferred);
            if (st.ok()) deferred.push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
            break;
          case wire::Op::kPush:
          case wire::Op::kPushTwoBit:
            st = protocol_.Push(worker, s, h, grad, &deferred);
            if (st.ok()) deferred.push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
            break;
          case wire::Op::kPushPull:
          case wire::Op::kPushPullTwoBit:
          case wire::Op::kPushPullTwoBitPacked:
            st = protocol_.Push(worker, s, h, grad, &deferred);
            if (st.ok()) {
              protocol_.Pull(s, h.step, wire::AcceptsPacked(h.op), std::move(reply), &deferred);
            }
            break;
          case wire::Op::kPull:
          case wire::Op::kPullPacked:
            protocol_.Pull(s, h.step, wire::AcceptsPacked(h.op), std::move(reply), &deferred);
            break;
          case wire::Op::kStash:
            Stash(s, h, frame);
            deferred.push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
            break;
          case wire::Op::kFetch:
            Fetch(s, h, std::move(reply), &deferred);
            break;
          case wire::Op::kBulk:  // the front-ends hand over a bulk's entries one by one
            st = InvalidArgumentError("a bulk frame inside a bulk frame");
            break;
          case wire::Op::kSave:
          case wire::Op::kLoad:
          case wire::Op::kReplay:
          case wire::Op::kRejoin:
          case wire::Op::kWorld:
          case wire::Op::kHandOut:
          case wire::Op::kHandIn:
            break;  // handled above
        }
      }
    }
  }
  if (!st.ok()) {
    series_.RequestFailed();
    reply(st, Answer{});
  }
  RunReplies(&deferred);
}

Status SliceStore::MarkRejoined(int32_t worker) {
  ReaderMutexLock map_lock(table_.mu());
  if (!table_.installed()) {
    return FailedPreconditionError("rejoin of worker " + std::to_string(worker) +
                                   ": no shard map installed on server " +
                                   std::to_string(config_.server_rank) + " yet");
  }
  for (Slice* s : table_.All()) {
    MutexLock lock(&s->mu);
    s->rejoin.Mark(worker, config_.slots());
  }
  return Status::Ok();
}

Status SliceStore::AddWorld(int32_t worker, const wire::RequestHeader& h,
                           const wire::Chunks& frame) {
  auto members = wire::ParseWorldMembers(frame, wire::kRequestHeaderBytes, h.payload_bytes,
                                         worlds_.slots());
  if (!members.ok()) return members.status();
  if (std::find(members->begin(), members->end(), worker) == members->end()) {
    return InvalidArgumentError("world: worker " + std::to_string(worker) +
                                " announced a world it is not in");
  }
  auto world = worlds_.Make(h.step, *members);
  if (!world.ok()) return world.status().Annotate("world");
  // One installation at a time, and a repeat is answered only once the world is in force on
  // every slice (its sender pushes right after).
  MutexLock install(&world_install_mu_);
  if (worlds_.IsCurrent(**world)) return Status::Ok();  // every member announces it
  ReaderMutexLock map_lock(table_.mu());  // no slice is added meanwhile
  const std::vector<Slice*> slices = table_.All();
  for (Slice* s : slices) {
    // Too late once a slice counted a push of its next step: that push was counted against
    // the old world. Every member announces before its first push in the new world, so this
    // catches only a peer that did not.
    MutexLock lock(&s->mu);
    if (s->pushes > 0) {
      return FailedPreconditionError((*world)->Describe() + " announced too late: " + s->name +
                                     " already counted " + std::to_string(s->pushes) +
                                     " pushes of step " + std::to_string(s->complete + 1) +
                                     " in " + s->world->Describe());
    }
  }
  TRELLIS_RETURN_IF_ERROR(worlds_.Advance(*world).Annotate("world"));
  // A lost worker this world names again (a grow into its slot) counts from here on.
  std::vector<int32_t> back;
  for (auto it = lost_.begin(); it != lost_.end();) {
    if ((*world)->epoch > it->second && (*world)->Has(it->first)) {
      back.push_back(it->first);
      it = lost_.erase(it);
    } else {
      ++it;
    }
  }
  for (Slice* s : slices) {
    MutexLock lock(&s->mu);
    s->world = *world;
    for (int32_t slot : back) StepProtocol::Unlose(slot, s);
  }
  for (int32_t slot : back) rebuild_.Unlose(slot);
  TLOG_INFO << "server " << config_.server_rank << ": " << (*world)->Describe()
            << " from each slice's next step";
  return Status::Ok();
}

void SliceStore::RunReplies(std::vector<DeferredReply>* deferred) {
  for (auto& d : *deferred) {
    if (!d.status.ok()) {
      series_.RequestFailed();
    } else if (d.packed) {
      series_.Sent(d.packed->size());
    } else if (d.values) {
      series_.Sent(d.values->size() * sizeof(float));
    }
    d.reply(d.status, Answer{std::move(d.values), std::move(d.packed)});
  }
}

int64_t SliceStore::ResizedAway() const {
  ReaderMutexLock map_lock(table_.mu());
  if (table_.world_epoch() == 0 || table_.num_slices() != 0) return 0;
  for (Slice* s : table_.Retired()) {
    MutexLock lock(&s->mu);
    if (!s->move.released) return 0;
  }
  return table_.world_epoch();
}

Status SliceStore::LoseWorker(int32_t slot, int64_t epoch) {
  if (slot < 0 || slot >= config_.slots()) {
    return InvalidArgumentError("lost worker " + std::to_string(slot) + " is not a slot of this job [0, " +
                                std::to_string(config_.slots()) + ")");
  }
  std::vector<DeferredReply> deferred;
  {
    MutexLock install(&world_install_mu_);
    if (auto it = lost_.find(slot); it != lost_.end() && it->second >= epoch) return Status::Ok();
    // A world at least as new that names the slot already brought it back: an old loss.
    if (worlds_.Current()->epoch >= epoch && worlds_.Current()->Has(slot)) return Status::Ok();
    lost_[slot] = epoch;
    ReaderMutexLock map_lock(table_.mu());
    for (Slice* s : table_.All()) {
      MutexLock lock(&s->mu);
      if (s->rebuild) continue;  // a rebuild counts the replays it gets (slice_rebuild.h)
      protocol_.Lose(slot, s, &deferred);
    }
  }
  TLOG_WARN << "server " << config_.server_rank << ": worker " << slot << " lost for good (world " << epoch
            << " goes on without it): its pushes are no longer awaited";
  RunReplies(&deferred);
  rebuild_.Lose(slot);  // a rebuild under way (or to come) does not wait for its replays
  handover_.WorkerLost(slot);  // nor a slice moved away for it to take its state
  return Status::Ok();
}

void SliceStore::Stash(Slice* s, const wire::RequestHeader& h, const wire::Chunks& frame) {
  // The payload's length was checked against the slice (CheckPayload). One stash per rejoin
  // under way (a grow brings several joiners at once), at most kMaxStashes or the job's worker
  // slots: the oldest goes first, so memory stays bounded.
  auto v = std::make_shared<std::vector<float>>(s->num_elements);
  wire::CopyFloats(frame, wire::kRequestHeaderBytes, s->num_elements, v->data());
  s->rejoin.Put(static_cast<uint64_t>(h.step), std::move(v),
                std::min<size_t>(kMaxStashes, static_cast<size_t>(config_.slots())));
}

void SliceStore::Fetch(Slice* s, const wire::RequestHeader& h, StoreReply reply,
                       std::vector<DeferredReply>* out) {
  auto v = s->rejoin.Fetch(static_cast<uint64_t>(h.step), s->name);
  if (!v.ok()) {
    out->push_back({std::move(reply), v.status(), nullptr, nullptr});
  } else {
    out->push_back({std::move(reply), Status::Ok(), std::move(*v), nullptr});
  }
}

void SliceStore::FailWaiters(const Status& status) {
  std::vector<StoreReply> replies;
  {
    ReaderMutexLock map_lock(table_.mu());
    for (Slice* s : table_.All()) {
      MutexLock lock(&s->mu);
      for (auto& w : s->waiters) replies.push_back(std::move(w.reply));
      s->waiters.clear();
    }
  }
  series_.PullAnswered(replies.size());
  for (auto& r : replies) r(status, Answer{});
}

int64_t SliceStore::CompleteStep(uint64_t key, uint32_t slice) const {
  ReaderMutexLock map_lock(table_.mu());
  Slice* s = table_.Find(key, slice);
  if (s == nullptr) return -1;
  MutexLock lock(&s->mu);
  return s->complete;
}

}  // namespace trellis
