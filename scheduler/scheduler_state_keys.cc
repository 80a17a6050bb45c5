// SchedulerState: key declarations and the shard map.
#include <algorithm>

#include "common/logging.h"
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

}  // namespace trellis
