#include "operator/leader_election.h"

#include <ctime>

namespace trellis::op {

std::string FormatMicroTime(Clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count() % 1000000;
  std::string s = FormatTime(t);  // "...:07Z"
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lld", static_cast<long long>(us < 0 ? us + 1000000 : us));
  return s.substr(0, s.size() - 1) + frac + "Z";
}

bool CanHoldLease(const Json& lease, const std::string& identity, Clock::time_point now) {
  const std::string holder = Str(lease, {"spec", "holderIdentity"});
  if (holder.empty() || holder == identity) return true;
  const auto renewed = ParseTime(Str(lease, {"spec", "renewTime"}));
  const auto duration = Int(lease, {"spec", "leaseDurationSeconds"}).value_or(15);
  if (!renewed) return true;  // an unreadable lease is treated as expired
  // ParseTime drops the fraction: add a second so an expiry is never seen early.
  return now >= *renewed + std::chrono::seconds(duration + 1);
}

LeaderElector::LeaderElector(KubeClient& client, LeaseOptions options, Now now)
    : client_(client), options_(std::move(options)), now_(std::move(now)) {}

StatusOr<bool> LeaderElector::TryAcquireOrRenew() {
  const Clock::time_point now = now_();
  auto lease = client_.Get(kLeases, options_.ns, options_.name);
  if (!lease.ok() && lease.status().code() != StatusCode::kNotFound) return lease.status();
  if (!lease.ok()) {
    Json l = Json::object();
    l["apiVersion"] = JStr("coordination.k8s.io/v1");
    l["kind"] = JStr("Lease");
    Put(l, {"metadata", "name"}, JStr(options_.name));
    Put(l, {"metadata", "namespace"}, JStr(options_.ns));
    Put(l, {"spec", "holderIdentity"}, JStr(options_.identity));
    Put(l, {"spec", "leaseDurationSeconds"}, Json::number(static_cast<int>(options_.duration.count())));
    Put(l, {"spec", "acquireTime"}, JStr(FormatMicroTime(now)));
    Put(l, {"spec", "renewTime"}, JStr(FormatMicroTime(now)));
    Put(l, {"spec", "leaseTransitions"}, Json::number(0));
    auto c = client_.Create(kLeases, options_.ns, l);
    if (c.ok()) return true;
    if (c.status().code() == StatusCode::kAlreadyExists) return false;  // someone was faster
    return c.status();
  }
  if (!CanHoldLease(*lease, options_.identity, now)) return false;
  Json l = *lease;
  if (Str(l, {"spec", "holderIdentity"}) != options_.identity) {
    Put(l, {"spec", "holderIdentity"}, JStr(options_.identity));
    Put(l, {"spec", "acquireTime"}, JStr(FormatMicroTime(now)));
    Put(l, {"spec", "leaseTransitions"}, Json::number(static_cast<int>(Int(l, {"spec", "leaseTransitions"}).value_or(0) + 1)));
  }
  Put(l, {"spec", "leaseDurationSeconds"}, Json::number(static_cast<int>(options_.duration.count())));
  Put(l, {"spec", "renewTime"}, JStr(FormatMicroTime(now)));
  auto u = client_.Update(kLeases, options_.ns, options_.name, l);
  if (u.ok()) return true;
  if (u.status().code() == StatusCode::kAborted) return false;  // lost the race
  return u.status();
}

Status LeaderElector::Release() {
  auto lease = client_.Get(kLeases, options_.ns, options_.name);
  if (!lease.ok()) return lease.status().code() == StatusCode::kNotFound ? Status::Ok() : lease.status();
  if (Str(*lease, {"spec", "holderIdentity"}) != options_.identity) return Status::Ok();
  const std::string now = FormatMicroTime(now_());
  Json l = *lease;
  Put(l, {"spec", "holderIdentity"}, JStr(""));
  Put(l, {"spec", "leaseDurationSeconds"}, Json::number(1));
  Put(l, {"spec", "acquireTime"}, JStr(now));
  Put(l, {"spec", "renewTime"}, JStr(now));
  auto u = client_.Update(kLeases, options_.ns, options_.name, l);
  // A conflict means someone else wrote the lease meanwhile: it is not ours to release any more.
  if (!u.ok() && u.status().code() != StatusCode::kAborted) return u.status();
  return Status::Ok();
}

}  // namespace trellis::op
