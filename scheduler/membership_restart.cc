// Membership after a scheduler restart (restart_recovery.h): a pod that held a rank under the old
// scheduler takes it back (Adopt), a new pod takes a rank whose member never came back
// (TakeOrphan), the end of the grace marks the missing dead, and a worker hands back the
// servers' addresses.
#include <algorithm>

#include "common/base/logging.h"
#include "scheduler/membership.h"

namespace trellis {

Status Membership::CheckAdoptable(const v1::RegisterRequest& req) const {
  const v1::Role role = req.role();
  const int32_t expected = size(role);
  const int32_t rank = req.previous_rank();
  if (rank < 0 || rank >= expected) {
    return InvalidArgumentError("pod " + req.pod_name() + " held " + RoleName(role) + " rank " +
                                std::to_string(rank) + ", but the job has " +
                                std::to_string(expected) + " " + RoleName(role) + "s");
  }
  if (req.previous_restarts() < 0) {
    return InvalidArgumentError("previous_restarts must be >= 0, got " +
                                std::to_string(req.previous_restarts()));
  }
  const Member& n = at(role, rank);
  if (n.registered && !n.pod_name.empty()) {
    return FailedPreconditionError("pod " + req.pod_name() + " held " + RoleName(role) + " " +
                                   std::to_string(rank) + ", but pod " + n.pod_name +
                                   " holds it now");
  }
  return Status::Ok();
}

int32_t Membership::Adopt(const v1::RegisterRequest& req) {
  const v1::Role role = req.role();
  const int32_t rank = req.previous_rank();
  Member& n = mutable_at(role, rank);
  if (!n.registered) {
    ++registered_count(role);
  } else {
    TLOG_INFO << RoleName(role) << " " << rank << " came back after the recovery grace: revived";
  }
  n.registered = true;
  n.pod_name = req.pod_name();
  n.host = req.host();
  n.gpus = req.gpus();
  n.dead = false;
  n.exited = false;
  n.restart_reported = false;
  n.restarts = req.previous_restarts();
  // The agent's count: its program's restarts inside this pod (those of earlier pods are lost).
  n.program_restarts = std::max(n.program_restarts, req.previous_restarts());
  // resume: the program runs on under its incarnation; else the agent is starting it again.
  n.incarnation = req.resume() ? req.previous_incarnation() : req.previous_incarnation() + 1;
  if (!req.resume()) {
    n.ready = false;  // a restarted server reports its (new) address again
    n.address.clear();
  }
  n.last_seen = clock_->Now();
  pods_.emplace(req.pod_name(), std::make_pair(role, rank));
  TLOG_INFO << RoleName(role) << " " << rank << " (pod " << req.pod_name() << ") is back"
            << (req.resume() ? "" : " and restarting its program") << ", incarnation "
            << n.incarnation;
  ++registrations_;
  return rank;
}

int32_t Membership::TakeOrphan(const v1::RegisterRequest& req) {
  const v1::Role role = req.role();
  const int32_t expected = size(role);
  auto orphan = [&](int32_t r) {
    const Member& n = at(role, r);
    return n.registered && n.pod_name.empty();
  };
  int32_t rank = -1;
  // The pod's ordinal first ("<job>-worker-1" takes rank 1), as for a first registration.
  const size_t dash = req.pod_name().rfind('-');
  if (dash != std::string::npos && dash + 1 < req.pod_name().size() &&
      req.pod_name().size() - dash - 1 <= 9 &&
      req.pod_name().find_first_not_of("0123456789", dash + 1) == std::string::npos) {
    const int32_t ordinal = std::stoi(req.pod_name().substr(dash + 1));
    if (ordinal < expected && orphan(ordinal)) rank = ordinal;
  }
  for (int32_t r = 0; r < expected && rank < 0; ++r) {
    if (orphan(r)) rank = r;
  }
  if (rank < 0) return -1;
  Member& n = mutable_at(role, rank);
  n.pod_name = req.pod_name();
  n.host = req.host();
  n.gpus = req.gpus();
  n.dead = false;
  n.exited = false;
  n.ready = false;
  n.address.clear();
  // Its old incarnation is unknown; > 1 tells a worker that it joins a running job.
  n.incarnation = std::max<int64_t>(n.incarnation, 1) + 1;
  ++n.restarts;
  ++restarts_;
  n.last_seen = clock_->Now();
  pods_.emplace(req.pod_name(), std::make_pair(role, rank));
  TLOG_INFO << RoleName(role) << " " << rank << " (missing since the scheduler restarted) taken "
            << "by pod " << req.pod_name() << ", incarnation " << n.incarnation;
  return rank;
}

int Membership::MarkMissingDead(TimePoint now, std::string* names) {
  int missing = 0;
  for (v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    std::vector<Member>& nodes = role == v1::ROLE_SERVER ? servers_ : workers_;
    for (size_t r = 0; r < nodes.size(); ++r) {
      Member& n = nodes[r];
      n.last_seen = now;  // heartbeat timeouts start afresh
      if (n.registered || n.departed) continue;  // departed: resized away (elastic jobs)
      // The normal dead-node path: shown dead, never a donor; the pod may still come back.
      n.registered = true;
      n.dead = true;
      ++dead_detected_;
      ++registered_count(role);
      if (missing++ < 10) {
        *names += (names->empty() ? "" : ", ") + std::string(RoleName(role)) + " " +
                  std::to_string(r);
      }
    }
  }
  return missing;
}

void Membership::AdoptServerAddresses(const v1::ResumeRequest& req) {
  // Addresses of servers that have not reported ready themselves yet (their own report wins).
  for (int32_t r = 0; r < req.server_addresses_size() && r < size(v1::ROLE_SERVER); ++r) {
    Member& s = servers_[static_cast<size_t>(r)];
    if (!s.ready && !req.server_addresses(r).empty()) {
      s.ready = true;
      s.address = req.server_addresses(r);
    }
  }
}

}  // namespace trellis
