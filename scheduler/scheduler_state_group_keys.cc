// SchedulerState: local groups' bootstrap keys (the NCCL unique id a multi-GPU pod's local rank 0
// hands to the pod's other processes).
#include <algorithm>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;  // NOLINT: helpers shared by the state's files

namespace {

Status CheckGroupName(const std::string& group) {
  if (group.empty() || group.size() > 256) {
    return InvalidArgumentError("group name must be 1 to 256 characters, got " +
                                std::to_string(group.size()));
  }
  return Status::Ok();
}

}  // namespace

Status SchedulerState::MakeGroupKeyRoomLocked() {
  if (group_keys_.size() < kMaxGroupKeys) return Status::Ok();
  // Names carry the pod's incarnation, so old entries are dead pods' groups: drop the oldest.
  auto oldest = group_keys_.end();
  for (auto it = group_keys_.begin(); it != group_keys_.end(); ++it) {
    if (!it->second.published || !it->second.waiters.empty()) continue;
    if (oldest == group_keys_.end() || it->second.published_seq < oldest->second.published_seq) {
      oldest = it;
    }
  }
  if (oldest == group_keys_.end()) {
    return ResourceExhaustedError("too many local groups waiting for their key (" +
                                  std::to_string(kMaxGroupKeys) + ")");
  }
  group_keys_.erase(oldest);
  return Status::Ok();
}

Status SchedulerState::PublishGroupKey(const v1::PublishGroupKeyRequest& req) {
  TRELLIS_RETURN_IF_ERROR(CheckGroupName(req.group()));
  if (req.key().empty() || req.key().size() > kMaxGroupKeyBytes) {
    return InvalidArgumentError("group \"" + req.group() + "\": key must be 1 to " +
                                std::to_string(kMaxGroupKeyBytes) + " bytes, got " +
                                std::to_string(req.key().size()));
  }
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return UnavailableError("scheduler is shutting down");
    if (group_keys_.count(req.group()) == 0) TRELLIS_RETURN_IF_ERROR(MakeGroupKeyRoomLocked());
    GroupKey& k = group_keys_[req.group()];
    k.published = true;
    k.key = req.key();  // a republished group (same name) overwrites
    k.published_seq = ++group_key_seq_;
    for (auto& w : k.waiters) {
      deferred.push_back([done = std::move(w.done), key = k.key] { done(key); });
    }
    k.waiters.clear();
  }
  Run(deferred);
  return Status::Ok();
}

void SchedulerState::GetGroupKey(const v1::GetGroupKeyRequest& req, TimePoint deadline,
                                 Callback<std::string> done) {
  if (Status st = CheckGroupName(req.group()); !st.ok()) {
    done(st);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  Status st = shutdown_ ? UnavailableError("scheduler is shutting down") : Status::Ok();
  if (st.ok() && group_keys_.count(req.group()) == 0) st = MakeGroupKeyRoomLocked();
  if (!st.ok()) {
    lock.unlock();
    done(st);
    return;
  }
  GroupKey& k = group_keys_[req.group()];
  if (k.published) {
    std::string key = k.key;
    lock.unlock();
    done(std::move(key));
    return;
  }
  k.waiters.push_back({clock_->Now(), deadline, std::move(done)});
}

void SchedulerState::SweepGroupKeysLocked(TimePoint now, Deferred* deferred) {
  for (auto it = group_keys_.begin(); it != group_keys_.end();) {
    auto& waiters = it->second.waiters;
    auto past = std::partition(waiters.begin(), waiters.end(),
                               [&](const GroupKeyWaiter& w) { return w.deadline > now; });
    for (auto w = past; w != waiters.end(); ++w) {
      const Status st = DeadlineExceededError(
          "group \"" + it->first + "\": no key published within " +
          std::to_string(static_cast<int64_t>(Seconds(now - w->arrived) * 1000)) +
          " ms (local rank 0 of the pod publishes it; did it start?)");
      deferred->push_back([done = std::move(w->done), st] { done(st); });
    }
    waiters.erase(past, waiters.end());
    // A name nobody published and nobody waits for any more takes no room.
    if (!it->second.published && waiters.empty()) {
      it = group_keys_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace trellis
