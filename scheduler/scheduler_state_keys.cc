// SchedulerState: key declarations and the shard map.
#include <algorithm>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/shard_map.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

std::string SchedulerState::KeyMismatchLocked(int32_t rank_a, const KeyPtrs& a, int32_t rank_b,
                                              const KeyPtrs& b) const {
  // Messages name the lower rank first, whatever the arrival order.
  if (rank_b < rank_a) return KeyMismatchLocked(rank_b, b, rank_a, a);
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

std::string SchedulerState::MissingDeclarersLocked() const {
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

void SchedulerState::FailDeclarationsLocked(const Status& status, Deferred* deferred) {
  for (auto& w : declare_waiters_) {
    deferred->push_back([done = std::move(w.done), status] { done(status); });
  }
  declare_waiters_.clear();
  CloseExtensionLocked(status, deferred);
}

bool SchedulerState::DeclareKeys(const v1::DeclareKeysRequest& req, TimePoint deadline,
                                 Callback<std::shared_ptr<const v1::ShardMap>> done) {
  // Pointers sorted by id: 10^4-key declarations from every worker are checked without copies.
  const KeyPtrs keys = SortedById(req.keys());
  if (Status st = ValidateSortedKeys(keys); !st.ok()) {
    done(st.Annotate("worker " + std::to_string(req.worker_rank())));
    return false;
  }
  return DeclareImpl(req.worker_rank(), &keys, deadline, std::move(done));
}

void SchedulerState::DeclareSameKeys(int32_t worker_rank, TimePoint deadline,
                                     Callback<std::shared_ptr<const v1::ShardMap>> done) {
  DeclareImpl(worker_rank, nullptr, deadline, std::move(done));
}

bool SchedulerState::DeclareImpl(int32_t rank, const std::vector<const v1::KeySpec*>* keys,
                                 TimePoint deadline,
                                 Callback<std::shared_ptr<const v1::ShardMap>> done) {
  Deferred deferred;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Status st = CheckNodeLocked(v1::ROLE_WORKER, rank, true);
    if (st.ok() && shutdown_) st = UnavailableError("scheduler is shutting down");
    if (st.ok() && failed_) st = AbortedError("job failed: " + failure_message_);
    if (st.ok()) st = keys_error_;
    if (st.ok() && keys == nullptr && reference_rank_ < 0) {
      st = InternalError("DeclareSameKeys before any declaration");
    } else if (st.ok() && reference_rank_ < 0) {
      reference_keys_.reserve(keys->size());
      for (const auto* k : *keys) reference_keys_.push_back(*k);
      reference_ptrs_ = SortedById(reference_keys_);
      reference_rank_ = rank;
    } else if (st.ok() && keys != nullptr && shard_map_ && !SameKeys(reference_ptrs_, *keys)) {
      // Keys added after training started (deferred init).
      ExtendLocked(rank, *keys, deadline, std::move(done), &deferred);
      lock.unlock();
      Run(deferred);
      return true;
    } else if (st.ok() && keys != nullptr && !SameKeys(reference_ptrs_, *keys)) {
      // Name the lowest rank that declared the reference keys, whatever the arrival order.
      const int32_t ref_rank = declared_ranks_.empty() ? reference_rank_ : *declared_ranks_.begin();
      keys_error_ =
          FailedPreconditionError(KeyMismatchLocked(ref_rank, reference_ptrs_, rank, *keys));
      TLOG_ERROR << keys_error_.message();
      FailDeclarationsLocked(keys_error_, &deferred);
      st = keys_error_;
    }
    if (!st.ok()) {
      lock.unlock();
      Run(deferred);
      done(st);
      return false;
    }
    if (shard_map_) {  // a restarted worker declaring again: the map is settled
      auto map = shard_map_;
      lock.unlock();
      done(std::move(map));
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
        FailDeclarationsLocked(keys_error_, &deferred);
      } else {
        shard_map_ = std::make_shared<const v1::ShardMap>(std::move(built).value());
        TLOG_INFO << "shard map built: " << shard_map_->keys_size() << " keys, dispatch "
                  << config_.dispatch << ", sliceBytes " << config_.slice_bytes << ", "
                  << config_.num_servers << " servers";
        for (auto& w : declare_waiters_) {
          deferred.push_back([done = std::move(w.done), map = shard_map_] { done(map); });
        }
        declare_waiters_.clear();
      }
    }
  }
  Run(deferred);
  return true;
}

std::string SchedulerState::AddedKeysLocked() const {
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

void SchedulerState::CloseExtensionLocked(const Status& status, Deferred* deferred) {
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

void SchedulerState::ExtendLocked(int32_t rank, const std::vector<const v1::KeySpec*>& keys,
                                  TimePoint deadline,
                                  Callback<std::shared_ptr<const v1::ShardMap>> done,
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
                                              KeyMismatchLocked(ext_rank_, ext_ptrs_, rank, keys));
    TLOG_ERROR << st.message();
    CloseExtensionLocked(st, deferred);
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
    CloseExtensionLocked(st, deferred);
    return;
  }
  TLOG_INFO << "shard map extended with " << AddedKeysLocked() << ": "
            << built->keys_size() << " keys";
  shard_map_ = std::make_shared<const v1::ShardMap>(std::move(built).value());
  reference_keys_ = ext_keys_;
  reference_ptrs_ = SortedById(reference_keys_);
  CloseExtensionLocked(Status::Ok(), deferred);
}

}  // namespace trellis
