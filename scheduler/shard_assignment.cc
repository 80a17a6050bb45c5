#include "scheduler/shard_assignment.h"

#include <algorithm>

#include "common/base/logging.h"
#include "scheduler/shard_map.h"

namespace trellis {

namespace {

using KeyPtrs = ShardAssignment::KeyPtrs;

bool SameKey(const v1::KeySpec& a, const v1::KeySpec& b) {
  return a.id() == b.id() && a.name() == b.name() && a.num_elements() == b.num_elements() &&
         a.dtype() == b.dtype();
}

bool SameKeys(const KeyPtrs& a, const KeyPtrs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameKey(*a[i], *b[i])) return false;
  }
  return true;
}

// key 3 "fc2.weight" (the name only when there is one)
std::string KeyLabel(const v1::KeySpec& k) {
  std::string s = "key " + std::to_string(k.id());
  if (!k.name().empty()) s += " \"" + k.name() + "\"";
  return s;
}

// (1024 x float32)
std::string Shape(const v1::KeySpec& k) {
  return "(" + std::to_string(k.num_elements()) + " x " + DTypeName(k.dtype()) + ")";
}

}  // namespace

std::string ShardAssignment::KeyMismatch(int32_t rank_a, const KeyPtrs& a, int32_t rank_b,
                                         const KeyPtrs& b) const {
  // Messages name the lower rank first, whatever the arrival order.
  if (rank_b < rank_a) return KeyMismatch(rank_b, b, rank_a, a);
  const std::string wa = "worker " + std::to_string(rank_a);
  const std::string wb = "worker " + std::to_string(rank_b);
  auto lacks = [](const std::string& who, const v1::KeySpec& k, const std::string& has) {
    return "key mismatch: " + who + " does not declare " + KeyLabel(k) + " that " + has +
           " declares";
  };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i]->id() == b[j]->id()) {
      if (!SameKey(*a[i], *b[j])) {
        std::string other = a[i]->name() == b[j]->name() ? "" : KeyLabel(*b[j]) + " ";
        return "key mismatch: " + wa + " declares " + KeyLabel(*a[i]) + " " + Shape(*a[i]) + ", " +
               wb + " declares " + other + Shape(*b[j]);
      }
      ++i;
      ++j;
    } else if (a[i]->id() < b[j]->id()) {
      return lacks(wb, *a[i], wa);
    } else {
      return lacks(wa, *b[j], wb);
    }
  }
  if (i < a.size()) return lacks(wb, *a[i], wa);
  if (j < b.size()) return lacks(wa, *b[j], wb);
  return "";
}

std::string ShardAssignment::MissingDeclarers() const {
  std::string s;
  int listed = 0, more = 0;
  for (int32_t r = 0; r < config_.num_workers; ++r) {
    if (declared_ranks_.count(r) != 0) continue;
    if (listed < 10) {
      s += (listed == 0 ? "" : ", ") + std::to_string(r);
      ++listed;
    } else {
      ++more;
    }
  }
  if (more > 0) s += " and " + std::to_string(more) + " more";
  return s;
}

void ShardAssignment::FailAll(const Status& status, Deferred* deferred) {
  for (auto& w : declare_waiters_) {
    deferred->push_back([done = std::move(w.done), status] { done(status); });
  }
  declare_waiters_.clear();
  CloseExtension(status, deferred);
}

bool ShardAssignment::Declare(int32_t rank, const KeyPtrs* keys, TimePoint deadline,
                              MapReply done, Deferred* deferred) {
  Status st = keys_error_;
  if (st.ok() && keys == nullptr && reference_rank_ < 0) {
    st = InternalError("DeclareSameKeys before any declaration");
  } else if (st.ok() && reference_rank_ < 0) {
    reference_keys_.reserve(keys->size());
    for (const auto* k : *keys) reference_keys_.push_back(*k);
    reference_ptrs_ = SortedById(reference_keys_);
    reference_rank_ = rank;
  } else if (st.ok() && keys != nullptr && shard_map_ && !SameKeys(reference_ptrs_, *keys)) {
    // Keys added after training started (deferred init).
    Extend(rank, *keys, deadline, std::move(done), deferred);
    return true;
  } else if (st.ok() && keys != nullptr && !SameKeys(reference_ptrs_, *keys)) {
    // Name the lowest rank that declared the reference keys, whatever the arrival order.
    const int32_t ref_rank = declared_ranks_.empty() ? reference_rank_ : *declared_ranks_.begin();
    keys_error_ = FailedPreconditionError(KeyMismatch(ref_rank, reference_ptrs_, rank, *keys));
    TLOG_ERROR << keys_error_.message();
    FailAll(keys_error_, deferred);
    st = keys_error_;
  }
  if (!st.ok()) {
    deferred->push_back([done = std::move(done), st] { done(st); });
    return false;
  }
  if (shard_map_) {  // a restarted worker declaring again: the map is settled
    deferred->push_back([done = std::move(done), map = shard_map_] { done(map); });
    return true;
  }
  declared_ranks_.insert(rank);
  declare_waiters_.push_back({rank, deadline, std::move(done)});
  if (static_cast<int32_t>(declared_ranks_.size()) == config_.num_workers) {
    auto built = BuildShardMap(reference_keys_, config_.num_servers, config_.dispatch,
                               config_.slice_bytes);
    if (!built.ok()) {
      keys_error_ = built.status().Annotate("building the shard map");
      TLOG_ERROR << keys_error_.message();
      FailAll(keys_error_, deferred);
    } else {
      shard_map_ = std::make_shared<const v1::ShardMap>(std::move(built).value());
      TLOG_INFO << "shard map built: " << shard_map_->keys_size() << " keys, dispatch "
                << config_.dispatch << ", sliceBytes " << config_.slice_bytes << ", "
                << config_.num_servers << " servers";
      for (auto& w : declare_waiters_) {
        deferred->push_back([done = std::move(w.done), map = shard_map_] { done(map); });
      }
      declare_waiters_.clear();
    }
  }
  return true;
}

std::string ShardAssignment::AddedKeys() const {
  std::string s;
  size_t i = 0, named = 0, more = 0;
  for (const auto* k : ext_ptrs_) {
    while (i < reference_ptrs_.size() && reference_ptrs_[i]->id() < k->id()) ++i;
    if (i < reference_ptrs_.size() && reference_ptrs_[i]->id() == k->id()) continue;
    if (named < 5) {
      s += (named == 0 ? "" : ", ") + KeyLabel(*k);
      ++named;
    } else {
      ++more;
    }
  }
  if (more > 0) s += " and " + std::to_string(more) + " more";
  return s;
}

void ShardAssignment::CloseExtension(const Status& status, Deferred* deferred) {
  for (auto& w : ext_waiters_) {
    if (status.ok()) {
      deferred->push_back([done = std::move(w.done), map = shard_map_] { done(map); });
    } else {
      deferred->push_back([done = std::move(w.done), status] { done(status); });
    }
  }
  ext_waiters_.clear();
  ext_ranks_.clear();
  ext_rank_ = -1;
  ext_ptrs_.clear();
  ext_keys_.clear();
}

void ShardAssignment::Extend(int32_t rank, const KeyPtrs& keys, TimePoint deadline, MapReply done,
                             Deferred* deferred) {
  // Keys of the map may not change or go away: their slices hold state on the servers.
  size_t j = 0;
  for (const auto* k : reference_ptrs_) {
    while (j < keys.size() && keys[j]->id() < k->id()) ++j;
    if (j == keys.size() || !SameKey(*keys[j], *k)) {
      const std::string what =
          j < keys.size() && keys[j]->id() == k->id()
              ? "declares " + KeyLabel(*keys[j]) + " " + Shape(*keys[j]) + ", the shard map has " +
                    Shape(*k)
              : "no longer declares " + KeyLabel(*k) + " of the shard map";
      deferred->push_back([done = std::move(done),
                           st = FailedPreconditionError(
                               "key declaration after training started: worker " +
                               std::to_string(rank) + " " + what +
                               " (keys may only be added)")] { done(st); });
      return;
    }
  }
  if (ext_rank_ < 0) {
    ext_keys_.reserve(keys.size());
    for (const auto* k : keys) ext_keys_.push_back(*k);
    ext_ptrs_ = SortedById(ext_keys_);
    ext_rank_ = rank;
  } else if (!SameKeys(ext_ptrs_, keys)) {
    const Status st = FailedPreconditionError("key declaration after training started: " +
                                              KeyMismatch(ext_rank_, ext_ptrs_, rank, keys));
    TLOG_ERROR << st.message();
    CloseExtension(st, deferred);
    deferred->push_back([done = std::move(done), st] { done(st); });
    return;
  }
  ext_ranks_.insert(rank);
  ext_waiters_.push_back({rank, deadline, std::move(done)});
  if (static_cast<int32_t>(ext_ranks_.size()) < config_.num_workers) return;

  std::vector<v1::KeySpec> added;
  size_t i = 0;
  for (const auto* k : ext_ptrs_) {
    while (i < reference_ptrs_.size() && reference_ptrs_[i]->id() < k->id()) ++i;
    if (i < reference_ptrs_.size() && reference_ptrs_[i]->id() == k->id()) continue;
    added.push_back(*k);
  }
  auto built = ExtendShardMap(*shard_map_, std::move(added));
  if (!built.ok()) {
    const Status st = built.status().Annotate("extending the shard map");
    TLOG_ERROR << st.message();
    CloseExtension(st, deferred);
    return;
  }
  TLOG_INFO << "shard map extended with " << AddedKeys() << ": " << built->keys_size() << " keys";
  shard_map_ = std::make_shared<const v1::ShardMap>(std::move(built).value());
  reference_keys_ = ext_keys_;
  reference_ptrs_ = SortedById(reference_keys_);
  CloseExtension(Status::Ok(), deferred);
}

Status ShardAssignment::Install(int32_t rank, const v1::ShardMap& map, Deferred* deferred) {
  if (shard_map_) {
    if (ShardMapBytes(*shard_map_) == ShardMapBytes(map)) return Status::Ok();
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " holds a shard map that differs from the one handed back "
                                   "first (worker " + std::to_string(reference_rank_) + ")");
  }
  // A server resize's map has the servers of its world (within spec.elastic's bounds).
  const bool resized = map.world_epoch() > 0 && map.num_servers() >= config_.min_servers() &&
                       map.num_servers() <= config_.server_slots();
  TRELLIS_RETURN_IF_ERROR(ValidateShardMap(map, resized ? map.num_servers() : config_.num_servers,
                                           config_.dispatch, config_.slice_bytes)
                              .Annotate("shard map handed back by worker " + std::to_string(rank)));
  std::vector<v1::KeySpec> keys;
  keys.reserve(static_cast<size_t>(map.keys_size()));
  for (const auto& k : map.keys()) keys.push_back(k.key());
  const KeyPtrs ptrs = SortedById(keys);
  // Declarations that arrived before the map came back: answered if they are the map's keys.
  const bool same = reference_rank_ < 0 || SameKeys(reference_ptrs_, ptrs);
  reference_keys_ = std::move(keys);
  reference_ptrs_ = SortedById(reference_keys_);
  reference_rank_ = rank;
  shard_map_ = std::make_shared<const v1::ShardMap>(map);
  for (int32_t r = 0; r < config_.num_workers; ++r) declared_ranks_.insert(r);
  TLOG_INFO << "shard map handed back by worker " << rank << ": " << map.keys_size() << " keys";
  const Status mismatch = FailedPreconditionError(
      "the keys declared after the scheduler restarted differ from the running job's shard map");
  for (auto& w : declare_waiters_) {
    if (same) {
      deferred->push_back([done = std::move(w.done), m = shard_map_] { done(m); });
    } else {
      deferred->push_back([done = std::move(w.done), mismatch] { done(mismatch); });
    }
  }
  declare_waiters_.clear();
  return Status::Ok();
}

void ShardAssignment::Sweep(TimePoint now, Deferred* deferred) {
  auto dit = std::partition(declare_waiters_.begin(), declare_waiters_.end(),
                            [&](const DeclareWaiter& w) { return w.deadline > now; });
  if (dit != declare_waiters_.end()) {
    const Status st = DeadlineExceededError(
        "waiting for key declarations: " + std::to_string(declared_ranks_.size()) + " of " +
        std::to_string(config_.num_workers) + " workers declared; missing worker " +
        MissingDeclarers());
    for (auto w = dit; w != declare_waiters_.end(); ++w) {
      deferred->push_back([done = std::move(w->done), st] { done(st); });
    }
    declare_waiters_.erase(dit, declare_waiters_.end());
  }

  // A deferred-init round not complete by the first waiter's deadline fails for everyone in
  // it, naming the keys and who did not declare them: never a hang.
  const bool ext_expired = std::any_of(ext_waiters_.begin(), ext_waiters_.end(),
                                       [&](const DeclareWaiter& w) { return w.deadline <= now; });
  if (ext_expired) {
    std::string missing;
    for (int32_t r = 0; r < config_.num_workers; ++r) {
      if (ext_ranks_.count(r) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    const Status st = DeadlineExceededError(
        "key declaration after training started: " + AddedKeys() + " declared by " +
        std::to_string(ext_ranks_.size()) + " of " + std::to_string(config_.num_workers) +
        " workers; worker " + missing + " did not declare it (every worker must)");
    TLOG_ERROR << st.message();
    CloseExtension(st, deferred);
  }
}

ShardAssignment::TimePoint ShardAssignment::NextDeadline() const {
  TimePoint next = TimePoint::max();
  for (const auto& w : declare_waiters_) next = std::min(next, w.deadline);
  for (const auto& w : ext_waiters_) next = std::min(next, w.deadline);
  return next;
}

StatusOr<std::shared_ptr<const v1::ShardMap>> ShardAssignment::Relayout(int32_t servers,
                                                                        int64_t world_epoch) {
  if (!shard_map_) return FailedPreconditionError("no shard map yet: the workers have not declared their keys");
  if (ext_rank_ >= 0) {
    return FailedPreconditionError("keys declared after training started are being added to the shard map");
  }
  TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap map, RelayoutShardMap(*shard_map_, servers, world_epoch));
  shard_map_ = std::make_shared<const v1::ShardMap>(std::move(map));
  TLOG_INFO << "shard map laid out again: " << shard_map_->keys_size() << " keys on " << servers
            << " servers, in force from world " << world_epoch;
  return shard_map_;
}

}  // namespace trellis
