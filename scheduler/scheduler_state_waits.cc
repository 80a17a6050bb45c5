// SchedulerState: the calls that may wait -- key declarations, barriers, group keys, rejoins.
// Each checks the caller and the job here, then hands the call to its part under the lock; the
// replies the part collects run once the lock is released.
#include "scheduler/scheduler_state.h"

#include "scheduler/shard_map.h"

namespace trellis {

bool SchedulerState::DeclareKeys(const v1::DeclareKeysRequest& req, TimePoint deadline,
                                 Callback<std::shared_ptr<const v1::ShardMap>> done) {
  // Pointers sorted by id: 10^4-key declarations from every worker are checked without copies.
  const ShardAssignment::KeyPtrs keys = SortedById(req.keys());
  if (Status st = ValidateSortedKeys(keys); !st.ok()) {
    done(st.Annotate("worker " + std::to_string(req.worker_rank())));
    return false;
  }
  Deferred deferred;
  bool same;
  {
    MutexLock lock(&mu_);
    same = DeclareLocked(req.worker_rank(), &keys, deadline, std::move(done), &deferred);
  }
  RunDeferred(deferred);
  return same;
}

void SchedulerState::DeclareSameKeys(int32_t worker_rank, TimePoint deadline,
                                     Callback<std::shared_ptr<const v1::ShardMap>> done) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    DeclareLocked(worker_rank, nullptr, deadline, std::move(done), &deferred);
  }
  RunDeferred(deferred);
}

bool SchedulerState::DeclareLocked(int32_t rank, const ShardAssignment::KeyPtrs* keys,
                                   TimePoint deadline,
                                   Callback<std::shared_ptr<const v1::ShardMap>> done,
                                   Deferred* deferred) {
  Status st = members_.Check(v1::ROLE_WORKER, rank, true);
  if (st.ok()) st = OpenLocked(/*failed_counts=*/true);
  if (!st.ok()) {
    deferred->push_back([done = std::move(done), st] { done(st); });
    return false;
  }
  return shards_.Declare(rank, keys, deadline, std::move(done), deferred);
}

void SchedulerState::Barrier(const v1::BarrierRequest& req, TimePoint deadline,
                             Callback<v1::BarrierResponse> done) {
  if (Status st = Barriers::CheckRequest(req); !st.ok()) {
    done(st);
    return;
  }
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    Status st = members_.Check(req.role(), req.rank(), true);
    if (st.ok()) st = OpenLocked(/*failed_counts=*/true);
    if (st.ok()) {
      barriers_.Arrive(req, deadline, std::move(done), members_, recovery_.restarted(),
                       clock_->Now(), &deferred);
    } else {
      deferred.push_back([done = std::move(done), st] { done(st); });
    }
  }
  RunDeferred(deferred);
}

Status SchedulerState::PublishGroupKey(const v1::PublishGroupKeyRequest& req) {
  TRELLIS_RETURN_IF_ERROR(GroupKeys::CheckRequest(req));
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    TRELLIS_RETURN_IF_ERROR(OpenLocked(/*failed_counts=*/false));
    TRELLIS_RETURN_IF_ERROR(group_keys_.Publish(req, &deferred));
  }
  RunDeferred(deferred);
  return Status::Ok();
}

void SchedulerState::GetGroupKey(const v1::GetGroupKeyRequest& req, TimePoint deadline,
                                 Callback<std::string> done) {
  if (Status st = GroupKeys::CheckGroupName(req.group()); !st.ok()) {
    done(st);
    return;
  }
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    if (Status st = OpenLocked(/*failed_counts=*/false); !st.ok()) {
      deferred.push_back([done = std::move(done), st] { done(st); });
    } else {
      group_keys_.Get(req, deadline, std::move(done), clock_->Now(), &deferred);
    }
  }
  RunDeferred(deferred);
}

void SchedulerState::RequestRejoin(const v1::RequestRejoinRequest& req, TimePoint deadline,
                                   Callback<v1::RequestRejoinResponse> done) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    Status st = members_.Check(v1::ROLE_WORKER, req.rank(), /*must_be_registered=*/true);
    if (st.ok()) st = OpenLocked(/*failed_counts=*/true);
    if (st.ok()) {
      std::string failure;
      rejoins_.Request(req, deadline, std::move(done), members_, recovery_.recovering(),
                       clock_->Now(), &deferred, &failure);
      if (!failure.empty()) FailJobLocked(std::move(failure), &deferred);
    } else {
      deferred.push_back([done = std::move(done), st] { done(st); });
    }
  }
  RunDeferred(deferred);
}

void SchedulerState::WatchRejoins(const v1::WatchRejoinsRequest& req, TimePoint deadline,
                                  Callback<v1::WatchRejoinsResponse> done) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    Status st = members_.Check(v1::ROLE_WORKER, req.rank(), /*must_be_registered=*/true);
    if (st.ok()) st = OpenLocked(/*failed_counts=*/false);
    if (st.ok()) {
      rejoins_.Watch(req, deadline, std::move(done), members_, &deferred);
    } else {
      deferred.push_back([done = std::move(done), st] { done(st); });
    }
  }
  RunDeferred(deferred);
}

Status SchedulerState::RejoinServed(const v1::RejoinServedRequest& req) {
  Deferred deferred;
  {
    MutexLock lock(&mu_);
    TRELLIS_RETURN_IF_ERROR(rejoins_.Served(req, &deferred));
  }
  RunDeferred(deferred);
  return Status::Ok();
}

}  // namespace trellis
