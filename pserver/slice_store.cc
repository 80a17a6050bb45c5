#include "pserver/slice_store.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "datapath/codec/packed_sum.h"

namespace trellis {
namespace {

std::string SliceName(uint64_t key, const std::string& key_name, uint32_t slice) {
  std::string s = "key " + std::to_string(key);
  if (!key_name.empty()) s += " (" + key_name + ")";
  return s + " slice " + std::to_string(slice);
}


}  // namespace

SliceStore::SliceStore(StoreConfig config)
    : config_(std::move(config)),
      registry_(config_.metrics ? config_.metrics
                                : std::make_shared<MetricsRegistry>(MetricLabels{"", "server", config_.server_rank})),
      series_(*registry_) {}
SliceStore::~SliceStore() { FailWaiters(CancelledError("parameter server shutting down")); }

Status SliceStore::Install(const v1::ShardMap& map, int64_t* slices, int64_t* bytes) {
  std::string serialized;
  {
    google::protobuf::io::StringOutputStream sos(&serialized);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    map.SerializeToCodedStream(&cos);
  }
  std::unique_lock lock(map_mu_);
  if (installed_ != serialized) {
    if (!installed_.empty()) {
      TRELLIS_RETURN_IF_ERROR(CheckExtension(map));
    } else if (map.num_servers() <= config_.server_rank) {
      return InvalidArgumentError("shard map is for " + std::to_string(map.num_servers()) +
                                  " servers, this is server " +
                                  std::to_string(config_.server_rank));
    }
    for (const auto& ks : map.keys()) {
      for (const auto& sa : ks.slices()) {
        if (sa.server() == config_.server_rank && sa.num_elements() <= 0) {
          return InvalidArgumentError("shard map: " +
                                      SliceName(ks.key().id(), ks.key().name(), sa.index()) +
                                      " has " + std::to_string(sa.num_elements()) + " elements");
        }
      }
    }
    // A first map, or one that adds keys (deferred init): slices already held stay as they are.
    map_ = map;
    all_keys_.clear();
    for (const auto& ks : map_.keys()) {
      const auto& k = ks.key();
      all_keys_[k.id()] = KeyInfo{k.name(), &ks};
      for (const auto& sa : ks.slices()) {
        if (sa.server() != config_.server_rank || keys_[k.id()].count(sa.index()) != 0) continue;
        auto s = std::make_unique<Slice>();
        s->key = k.id();
        s->index = sa.index();
        s->name = SliceName(k.id(), k.name(), sa.index());
        s->num_elements = sa.num_elements();
        s->pushed.assign(config_.num_workers, false);
        keys_[k.id()][sa.index()] = std::move(s);
        ++num_slices_;
      }
    }
    installed_ = std::move(serialized);
  }
  *slices = num_slices_;
  *bytes = 0;
  for (const auto& [id, slices_of_key] : keys_) {
    for (const auto& [i, s] : slices_of_key) *bytes += s->num_elements * 4;
  }
  series_.SlicesHeld(*slices, *bytes);
  return Status::Ok();
}

Status SliceStore::CheckExtension(const v1::ShardMap& map) const {
  const auto differs = [&](const std::string& what) {
    return FailedPreconditionError("shard map differs from the one already installed on server " +
                                   std::to_string(config_.server_rank) + ": " + what +
                                   " (all workers must relay the same map; a later map may only "
                                   "add keys)");
  };
  if (map.slice_bytes() != map_.slice_bytes() || map.dispatch() != map_.dispatch() ||
      map.num_servers() != map_.num_servers()) {
    return differs("other settings");
  }
  std::unordered_map<uint64_t, const v1::KeyShards*> now;
  for (const auto& ks : map.keys()) now[ks.key().id()] = &ks;
  for (const auto& old : map_.keys()) {
    auto it = now.find(old.key().id());
    if (it == now.end()) return differs("key " + std::to_string(old.key().id()) + " is missing");
    const v1::KeyShards& ks = *it->second;
    bool same = ks.key().name() == old.key().name() &&
                ks.key().num_elements() == old.key().num_elements() &&
                ks.key().dtype() == old.key().dtype() && ks.slices_size() == old.slices_size();
    for (int i = 0; same && i < ks.slices_size(); ++i) {
      const auto& a = ks.slices(i);
      const auto& b = old.slices(i);
      same = a.index() == b.index() && a.offset() == b.offset() &&
             a.num_elements() == b.num_elements() && a.server() == b.server();
    }
    if (!same) return differs("key " + std::to_string(old.key().id()) + " is laid out otherwise");
  }
  return Status::Ok();
}

SliceStore::Slice* SliceStore::Find(uint64_t key, uint32_t slice) const {
  auto it = keys_.find(key);
  if (it == keys_.end()) return nullptr;
  auto jt = it->second.find(slice);
  return jt == it->second.end() ? nullptr : jt->second.get();
}

Status SliceStore::Describe404(uint64_t key, uint32_t slice) const {
  if (installed_.empty()) {
    return FailedPreconditionError("unknown key " + std::to_string(key) +
                                   ": no shard map installed on server " +
                                   std::to_string(config_.server_rank) + " yet");
  }
  auto it = all_keys_.find(key);
  if (it == all_keys_.end()) {
    return NotFoundError("unknown key " + std::to_string(key) + " (not in the shard map)");
  }
  const auto& ks = *it->second.shards;
  std::string name = SliceName(key, it->second.name, slice);
  if (slice >= static_cast<uint32_t>(ks.slices_size())) {
    return NotFoundError("unknown " + name + ": the key has " +
                         std::to_string(ks.slices_size()) + " slices");
  }
  return NotFoundError(name + " is held by server " +
                       std::to_string(ks.slices(slice).server()) + ", not server " +
                       std::to_string(config_.server_rank));
}

void SliceStore::Handle(int32_t worker, const wire::RequestHeader& h, const wire::Chunks& frame,
                        Reply reply, std::vector<float>* payload) {
  if (h.op == wire::Op::kSave || h.op == wire::Op::kLoad) {
    reply(HandleCheckpointOp(h), Answer{});
    return;
  }
  if (wire::IsReplay(h.op)) {
    HandleReplay(worker, h, frame, std::move(reply));
    return;
  }
  if (h.op == wire::Op::kRejoin) {
    reply(MarkRejoined(worker), Answer{});
    return;
  }
  std::vector<Deferred> deferred;
  Status st;
  series_.Request(h.op, wire::OpHasPayload(h.op) ? h.payload_bytes : 0);
  {
    std::shared_lock map_lock(map_mu_);
    Slice* s = Find(h.key, h.slice);
    if (s == nullptr) {
      st = Describe404(h.key, h.slice);
    } else {
      std::vector<uint8_t> scratch;  // a 2-bit or 16-bit frame split across chunks, gathered
      CodedFrame coded;
      st = CheckPayload(*s, h, frame, &scratch, &coded);
      if (st.ok()) {
        const bool coded_op = wire::IsTwoBit(h.op);
        const Gradient grad{&frame, coded_op ? &coded : nullptr, coded_op ? nullptr : payload};
        std::lock_guard lock(s->mu);
        if (s->rebuild && h.op != wire::Op::kInit) {
          RebuildRequest(worker, s, h, grad, std::move(reply), &deferred);
        } else switch (h.op) {
          case wire::Op::kInit:
            st = Init(s, frame, &deferred);
            if (st.ok()) deferred.push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
            break;
          case wire::Op::kPush:
          case wire::Op::kPushTwoBit:
            st = Push(worker, s, h, grad, &deferred);
            if (st.ok()) deferred.push_back({std::move(reply), Status::Ok(), nullptr, nullptr});
            break;
          case wire::Op::kPushPull:
          case wire::Op::kPushPullTwoBit:
          case wire::Op::kPushPullTwoBitPacked:
            st = Push(worker, s, h, grad, &deferred);
            if (st.ok()) Pull(s, h.step, wire::AcceptsPacked(h.op), std::move(reply), &deferred);
            break;
          case wire::Op::kPull:
          case wire::Op::kPullPacked:
            Pull(s, h.step, wire::AcceptsPacked(h.op), std::move(reply), &deferred);
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
            break;  // handled above
        }
      }
    }
  }
  if (!st.ok()) {
    series_.RequestFailed();
    reply(st, Answer{});
  }
  for (auto& d : deferred) {
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

Status SliceStore::CheckPayload(const Slice& s, const wire::RequestHeader& h,
                                const wire::Chunks& frame, std::vector<uint8_t>* scratch,
                                CodedFrame* coded) const {
  if (wire::IsTwoBit(h.op)) {
    const uint8_t* bytes =
        wire::Contiguous(frame, wire::kRequestHeaderBytes, h.payload_bytes, scratch);
    auto parsed = ParseCodedFrame(bytes, h.payload_bytes, static_cast<size_t>(s.num_elements));
    if (!parsed.ok()) {
      return InvalidArgumentError(s.name + ": " + wire::OpName(h.op) + ": " +
                                  parsed.status().message());
    }
    *coded = *parsed;
    return Status::Ok();
  }
  const int64_t got = static_cast<int64_t>(h.payload_bytes / sizeof(float));
  if (wire::OpHasPayload(h.op) && got != s.num_elements) {
    return InvalidArgumentError(s.name + ": " + wire::OpName(h.op) + " of " + std::to_string(got) +
                                " elements, the slice has " + std::to_string(s.num_elements));
  }
  return Status::Ok();
}

Status SliceStore::Init(Slice* s, const wire::Chunks& frame, std::vector<Deferred>* out) {
  if (s->complete != 0 || s->pushes != 0) {
    return FailedPreconditionError(s->name + ": init after step 1 started (complete step " +
                                   std::to_string(s->complete) + "); broadcast before training");
  }
  auto v = std::make_shared<std::vector<float>>(s->num_elements);
  wire::CopyFloats(frame, wire::kRequestHeaderBytes, s->num_elements, v->data());
  if (config_.mode == ServerMode::kUpdate) s->weights = *v;
  s->results[0] = v;
  s->result_step[0] = 0;
  s->initialized = true;
  // Wake pulls of step 0 (broadcast receivers).
  auto& ws = s->waiters;
  for (auto it = ws.begin(); it != ws.end();) {
    if (it->step == 0) {
      series_.PullAnswered();
      out->push_back({std::move(it->reply), Status::Ok(), v, nullptr});
      it = ws.erase(it);
    } else {
      ++it;
    }
  }
  return Status::Ok();
}

Status SliceStore::Push(int32_t worker, Slice* s, const wire::RequestHeader& h,
                        const Gradient& grad, std::vector<Deferred>* out) {
  if (RejoinPushIsNoOp(worker, s, h.step)) return Status::Ok();
  const int64_t expected = s->complete + 1;
  if (h.step != expected) {
    return OutOfRangeError(s->name + ": push for step " + std::to_string(h.step) +
                           " outside the window: the server expects step " +
                           std::to_string(expected) + " (latest complete step " +
                           std::to_string(s->complete) + ")");
  }
  if (config_.mode == ServerMode::kUpdate && !s->initialized) {
    return FailedPreconditionError(s->name + ": gradient pushed before the key was initialized "
                                   "(update mode needs Broadcast from the root before step 1)");
  }
  if (s->pushed[worker]) {
    return AlreadyExistsError(s->name + ": worker " + std::to_string(worker) +
                              " pushed step " + std::to_string(h.step) + " twice");
  }
  const size_t n = static_cast<size_t>(s->num_elements);
  using Clock = std::chrono::steady_clock;
  const auto add_start = Clock::now();
  // Whether the step stays a sum of 2-bit pushes of one threshold (then its answer can be packed).
  const float t = grad.coded != nullptr ? PackThreshold(*grad.coded) : 0.0f;
  s->step_threshold = s->pushes == 0 || s->step_threshold == t ? t : 0.0f;
  if (s->pushes == 0) {
    // First contribution: copy instead of zero + add. Reuse a result buffer nobody references.
    const bool swap = grad.coded == nullptr && grad.owner != nullptr && grad.owner->size() == n &&
                      s->accum && s->accum->size() == n;
    if (!s->accum) s->accum = std::make_unique<std::vector<float>>(n);
    if (swap) {
      // The request's buffer becomes the sum, the spare accumulator the caller's next read
      // buffer: no copy, and both were written before (no page faults).
      s->accum->swap(*grad.owner);
    } else if (grad.coded != nullptr) {
      DecodeCodedFrame(*grad.coded, s->accum->data());
    } else {
      wire::CopyFloats(*grad.frame, wire::kRequestHeaderBytes, n, s->accum->data());
    }
  } else if (grad.coded != nullptr) {
    DecodeAddCodedFrame(*grad.coded, s->accum->data());
  } else {
    wire::AddFloats(*grad.frame, wire::kRequestHeaderBytes, n, s->accum->data());
  }
  s->pushed[worker] = true;
  const auto add_end = Clock::now();
  series_.Aggregated(std::chrono::duration<double>(add_end - add_start).count());
  if (++s->pushes < config_.num_workers) return Status::Ok();

  // Step complete.
  const int64_t step = expected;
  Values result;
  float packable = 0;
  if (config_.mode == ServerMode::kAggregate) {
    result = std::shared_ptr<const std::vector<float>>(std::move(s->accum));
    packable = s->step_threshold;
  } else {
    float* g = s->accum->data();
    const float inv = 1.0f / static_cast<float>(config_.num_workers);
    for (size_t i = 0; i < n; ++i) g[i] *= inv;
    ApplyOptimizer(config_.optimizer, s->step_base + step, g, s->weights.data(), s->num_elements,
                   &s->opt);
    result = std::make_shared<const std::vector<float>>(s->weights);
  }
  // Recycle the buffer of step-2 as the next accumulator when no answer still references it
  // (saves a multi-MiB allocation and zero-fill per step).
  auto old = std::const_pointer_cast<std::vector<float>>(std::move(s->results[step % 2]));
  s->results[step % 2] = result;
  s->result_step[step % 2] = step;
  s->packable[step % 2] = packable;
  s->packed[step % 2] = nullptr;
  if (!s->accum && old && old.use_count() == 1 && old->size() == n) {
    s->accum = std::make_unique<std::vector<float>>(std::move(*old));
  }
  s->complete = step;
  s->pushes = 0;
  s->step_threshold = 0;
  std::fill(s->pushed.begin(), s->pushed.end(), false);
  auto& ws = s->waiters;
  for (auto it = ws.begin(); it != ws.end();) {
    if (it->step == step) {
      series_.PullAnswered();
      out->push_back({std::move(it->reply), Status::Ok(), result,
                      it->packed ? PackedFor(s, step) : nullptr});
      it = ws.erase(it);
    } else {
      ++it;
    }
  }
  series_.StepCompleted(std::chrono::duration<double>(Clock::now() - add_end).count());
  return Status::Ok();
}

Values SliceStore::ResultFor(Slice* s, int64_t step) const {
  int i = static_cast<int>(step % 2);
  return s->result_step[i] == step ? s->results[i] : nullptr;
}

Packed SliceStore::PackedFor(Slice* s, int64_t step) {
  const int i = static_cast<int>(step % 2);
  if (s->result_step[i] != step || s->packable[i] == 0) return nullptr;
  if (!s->packed[i]) {
    const int bits = PackedSumBits(config_.num_workers);
    const std::vector<float>& sum = *s->results[i];
    auto bytes =
        std::make_shared<std::vector<uint8_t>>(bits == 0 ? 0 : PackedSumBytes(sum.size(), bits));
    if (bits == 0 || !PackSum(sum.data(), sum.size(), s->packable[i], bits, bytes->data(),
                              bytes->size()).ok()) {
      // Too many workers for 8 bits, or (should not happen) a sum that is not one of 2-bit
      // pushes: float32 answers for this step, and no second try.
      s->packable[i] = 0;
      return nullptr;
    }
    s->packed[i] = std::move(bytes);
  }
  return s->packed[i];
}

void SliceStore::Pull(Slice* s, int64_t step, bool packed, Reply reply,
                      std::vector<Deferred>* out) {
  if (step < 0 || step < s->complete - 1 || step > s->complete + 1) {
    out->push_back({std::move(reply),
                    OutOfRangeError(s->name + ": pull of step " + std::to_string(step) +
                                    " outside the window [" +
                                    std::to_string(std::max<int64_t>(0, s->complete - 1)) + ", " +
                                    std::to_string(s->complete + 1) + "]"),
                    nullptr, nullptr});
    return;
  }
  if (step == s->complete + 1 || (step == 0 && !s->initialized && s->complete == 0)) {
    s->waiters.push_back({step, packed, std::move(reply)});  // answered when the step completes
    series_.PullWaiting();
    return;
  }
  Values v = ResultFor(s, step);
  if (!v) {
    out->push_back({std::move(reply),
                    FailedPreconditionError(s->name + ": step 0 was never initialized "
                                            "(no Broadcast from the root)"),
                    nullptr, nullptr});
    return;
  }
  Packed p = packed ? PackedFor(s, step) : nullptr;
  out->push_back({std::move(reply), Status::Ok(), std::move(v), std::move(p)});
}

void SliceStore::FailWaiters(const Status& status) {
  std::vector<Reply> replies;
  {
    std::shared_lock map_lock(map_mu_);
    for (auto& [id, slices] : keys_) {
      for (auto& [i, s] : slices) {
        std::lock_guard lock(s->mu);
        for (auto& w : s->waiters) replies.push_back(std::move(w.reply));
        s->waiters.clear();
      }
    }
  }
  series_.PullAnswered(replies.size());
  for (auto& r : replies) r(status, Answer{});
}

int64_t SliceStore::CompleteStep(uint64_t key, uint32_t slice) const {
  std::shared_lock map_lock(map_mu_);
  Slice* s = Find(key, slice);
  if (s == nullptr) return -1;
  std::lock_guard lock(s->mu);
  return s->complete;
}

}  // namespace trellis
