#include "scheduler/group_keys.h"

#include <algorithm>

namespace trellis {

Status GroupKeys::CheckGroupName(const std::string& group) {
  if (group.empty() || group.size() > 256) {
    return InvalidArgumentError("group name must be 1 to 256 characters, got " +
                                std::to_string(group.size()));
  }
  return Status::Ok();
}

Status GroupKeys::CheckRequest(const v1::PublishGroupKeyRequest& req) {
  TRELLIS_RETURN_IF_ERROR(CheckGroupName(req.group()));
  if (req.key().empty() || req.key().size() > kMaxKeyBytes) {
    return InvalidArgumentError("group \"" + req.group() + "\": key must be 1 to " +
                                std::to_string(kMaxKeyBytes) + " bytes, got " +
                                std::to_string(req.key().size()));
  }
  return Status::Ok();
}

Status GroupKeys::MakeRoom() {
  if (groups_.size() < kMaxKeys) return Status::Ok();
  // Names carry the pod's incarnation, so old entries are dead pods' groups: drop the oldest.
  auto oldest = groups_.end();
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    if (!it->second.published || !it->second.waiters.empty()) continue;
    if (oldest == groups_.end() || it->second.published_seq < oldest->second.published_seq) {
      oldest = it;
    }
  }
  if (oldest == groups_.end()) {
    return ResourceExhaustedError("too many local groups waiting for their key (" +
                                  std::to_string(kMaxKeys) + ")");
  }
  groups_.erase(oldest);
  return Status::Ok();
}

Status GroupKeys::Publish(const v1::PublishGroupKeyRequest& req, Deferred* deferred) {
  if (groups_.count(req.group()) == 0) TRELLIS_RETURN_IF_ERROR(MakeRoom());
  Group& k = groups_[req.group()];
  k.published = true;
  k.key = req.key();  // a republished group (same name) overwrites
  k.published_seq = ++seq_;
  for (auto& w : k.waiters) {
    deferred->push_back([done = std::move(w.done), key = k.key] { done(key); });
  }
  k.waiters.clear();
  return Status::Ok();
}

void GroupKeys::Get(const v1::GetGroupKeyRequest& req, TimePoint deadline,
                    Reply<std::string> done, TimePoint now, Deferred* deferred) {
  if (groups_.count(req.group()) == 0) {
    if (Status st = MakeRoom(); !st.ok()) {
      deferred->push_back([done = std::move(done), st] { done(st); });
      return;
    }
  }
  Group& k = groups_[req.group()];
  if (k.published) {
    deferred->push_back([done = std::move(done), key = k.key] { done(key); });
    return;
  }
  k.waiters.push_back({now, deadline, std::move(done)});
}

void GroupKeys::Sweep(TimePoint now, Deferred* deferred) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    auto& waiters = it->second.waiters;
    auto past = std::partition(waiters.begin(), waiters.end(),
                               [&](const Waiter& w) { return w.deadline > now; });
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
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

void GroupKeys::FailAll(const Status& status, Deferred* deferred) {
  for (auto& named : groups_) {
    for (auto& w : named.second.waiters) {
      deferred->push_back([done = std::move(w.done), status] { done(status); });
    }
    named.second.waiters.clear();
  }
}

GroupKeys::TimePoint GroupKeys::NextDeadline() const {
  TimePoint next = TimePoint::max();
  for (const auto& named : groups_) {
    for (const auto& w : named.second.waiters) next = std::min(next, w.deadline);
  }
  return next;
}

size_t GroupKeys::waiters() const {
  size_t n = 0;
  for (const auto& named : groups_) n += named.second.waiters.size();
  return n;
}

}  // namespace trellis
