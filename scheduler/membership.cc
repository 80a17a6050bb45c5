// Membership: registration and ranks, the members' reports (ready, heartbeat, exit, leave), and
// the members' part of the cluster view.
#include "scheduler/membership.h"

#include <algorithm>
#include <cctype>

#include "common/base/logging.h"
#include "scheduler/scheduler_client.h"

namespace trellis {

namespace {

const char* SignalName(int sig) {
  switch (sig) {
    case 1: return "SIGHUP";
    case 2: return "SIGINT";
    case 3: return "SIGQUIT";
    case 4: return "SIGILL";
    case 6: return "SIGABRT";
    case 7: return "SIGBUS";
    case 8: return "SIGFPE";
    case 9: return "SIGKILL";
    case 11: return "SIGSEGV";
    case 13: return "SIGPIPE";
    case 15: return "SIGTERM";
    default: return nullptr;
  }
}

Status StaleIncarnation(v1::Role role, int32_t rank, int64_t got, int64_t current) {
  return FailedPreconditionError(std::string(RoleName(role)) + " " + std::to_string(rank) +
                                 ": stale incarnation " + std::to_string(got) +
                                 ", current is " + std::to_string(current));
}

}  // namespace

std::string DescribeExitCode(int32_t code) {
  std::string s = "exit code " + std::to_string(code);
  if (code > 128 && code < 128 + 65) {
    const char* name = SignalName(code - 128);
    s += name != nullptr ? std::string(" (killed by ") + name + ")"
                         : " (killed by signal " + std::to_string(code - 128) + ")";
  }
  return s;
}

Membership::Membership(const SchedulerConfig& config, const Clock* clock)
    : config_(config),
      clock_(clock),
      servers_(static_cast<size_t>(config.server_slots())),
      workers_(static_cast<size_t>(config.worker_slots())) {
  // An elastic job's slots beyond its first workers and servers start outside the world
  // (world_plan.h).
  for (size_t r = static_cast<size_t>(config.num_workers); r < workers_.size(); ++r) workers_[r].departed = true;
  for (size_t r = static_cast<size_t>(config.num_servers); r < servers_.size(); ++r) servers_[r].departed = true;
}

int32_t Membership::ServersInForce() const {
  return static_cast<int32_t>(
      std::count_if(servers_.begin(), servers_.end(), [](const Member& s) { return !s.departed; }));
}

bool Membership::ServerReady(int32_t rank) const {
  return rank >= 0 && rank < size(v1::ROLE_SERVER) && Live(v1::ROLE_SERVER, rank) &&
         servers_[static_cast<size_t>(rank)].ready;
}

Status Membership::Check(v1::Role role, int32_t rank, bool must_be_registered) const {
  if (!KnownRole(role)) {
    return InvalidArgumentError("role must be ROLE_SERVER or ROLE_WORKER, got " +
                                std::to_string(static_cast<int>(role)));
  }
  const int32_t n = size(role);
  if (rank < 0 || rank >= n) {
    return InvalidArgumentError(std::string(RoleName(role)) + " rank must be in [0, " +
                                std::to_string(n) + "), got " + std::to_string(rank));
  }
  if (must_be_registered && !at(role, rank).registered) {
    // NOT_FOUND: after a scheduler restart, the caller registers (resumes) again.
    return NotFoundError(std::string(RoleName(role)) + " " + std::to_string(rank) +
                         " has not registered");
  }
  return Status::Ok();
}

const Membership::Member& Membership::at(v1::Role role, int32_t rank) const {
  return role == v1::ROLE_SERVER ? servers_[static_cast<size_t>(rank)]
                                 : workers_[static_cast<size_t>(rank)];
}

Membership::Member& Membership::mutable_at(v1::Role role, int32_t rank) {
  return role == v1::ROLE_SERVER ? servers_[static_cast<size_t>(rank)]
                                 : workers_[static_cast<size_t>(rank)];
}

bool Membership::Live(v1::Role role, int32_t rank) const {
  const Member& n = at(role, rank);
  return n.registered && !n.dead && !n.exited && !n.preempted;
}

int32_t Membership::WorkersAccountedFor() const {
  // A worker resized away before a scheduler restart never registers with the new one.
  return registered_workers_ + static_cast<int32_t>(std::count_if(
                                   workers_.begin(), workers_.end(),
                                   [](const Member& w) { return w.departed && !w.registered; }));
}

int32_t Membership::ServersAccountedFor() const {
  // The servers outside the world (a server slot no grow brought in, or one a shrink removed)
  // are not awaited.
  return static_cast<int32_t>(std::count_if(servers_.begin(), servers_.end(), [](const Member& s) {
    return s.registered || s.departed;
  }));
}

bool Membership::Complete() const {
  if (ServersAccountedFor() < size(v1::ROLE_SERVER) || WorkersAccountedFor() < size(v1::ROLE_WORKER)) {
    return false;
  }
  return std::all_of(servers_.begin(), servers_.end(), [](const Member& n) { return n.ready || n.departed; });
}

bool Membership::AllRegistered() const {
  return ServersAccountedFor() == size(v1::ROLE_SERVER) &&
         WorkersAccountedFor() == size(v1::ROLE_WORKER);
}

void Membership::FillNode(const Member& n, v1::Role role, int32_t rank, v1::NodeInfo* out) const {
  out->set_role(role);
  out->set_rank(rank);
  out->set_pod_name(n.pod_name);
  out->set_host(n.host);
  out->set_address(n.address);
  out->set_ready(n.ready);
  out->set_dead(n.dead);
  out->set_exited(n.exited);
  out->set_last_exit_code(n.last_exit_code);
  out->set_incarnation(n.incarnation);
  out->set_restarts(n.restarts);
  out->set_program_restarts(n.program_restarts);
  out->set_gpus(n.gpus);
  out->set_preempted(n.preempted);
  out->set_stalled(n.stalled);
  out->set_stall_reason(n.stall_reason);
  out->set_restarting(n.restarting);
  out->set_taken_over_by(n.taken_over_by);
  out->set_lost_pod(n.lost_pod);
}

void Membership::FillView(v1::ClusterView* v) const {
  // The servers in force (ranks 0..n-1); server_slots: how many the job may ever have.
  const int32_t servers = ServersInForce();
  v->set_num_servers(servers);
  v->set_server_slots(size(v1::ROLE_SERVER));
  v->set_num_workers(size(v1::ROLE_WORKER));
  v->mutable_servers()->Reserve(servers);
  for (int32_t r = 0; r < servers; ++r) {
    FillNode(servers_[static_cast<size_t>(r)], v1::ROLE_SERVER, r, v->add_servers());
  }
  v->mutable_workers()->Reserve(size(v1::ROLE_WORKER));
  for (int32_t r = 0; r < size(v1::ROLE_WORKER); ++r) {
    FillNode(workers_[static_cast<size_t>(r)], v1::ROLE_WORKER, r, v->add_workers());
  }
}

Status Membership::CheckRequest(const v1::RegisterRequest& req, const SchedulerConfig& config) {
  if (!KnownRole(req.role())) {
    return InvalidArgumentError("role must be ROLE_SERVER or ROLE_WORKER, got " +
                                std::to_string(static_cast<int>(req.role())));
  }
  if (req.pod_name().empty()) return InvalidArgumentError("pod_name must be set");
  if (req.pod_name().size() > 253) {
    return InvalidArgumentError("pod_name must be at most 253 characters, got " +
                                std::to_string(req.pod_name().size()));
  }
  if (req.gpus() < 0) {
    return InvalidArgumentError("gpus must be >= 0, got " + std::to_string(req.gpus()));
  }
  if (!config.job_name.empty() && !req.job().empty() && req.job() != config.job_name) {
    return InvalidArgumentError("registration for job \"" + req.job() +
                                "\" reached the scheduler of job \"" + config.job_name + "\"");
  }
  return Status::Ok();
}

// Pods named like a StatefulSet or the launcher names them ("<job>-worker-<i>") get rank i, so
// ranks follow pod names and do not depend on who registers first; any other name, or an
// ordinal that is out of range or taken, gets the lowest free rank.
int32_t Membership::PreferredFreeRank(v1::Role role, const std::string& pod_name) const {
  const int32_t expected = size(role);
  size_t digits = 0;
  while (digits < pod_name.size() && digits < 9 &&
         std::isdigit(static_cast<unsigned char>(pod_name[pod_name.size() - 1 - digits]))) {
    ++digits;
  }
  if (digits > 0 && digits < pod_name.size() && pod_name[pod_name.size() - 1 - digits] == '-') {
    const int32_t ordinal = std::stoi(pod_name.substr(pod_name.size() - digits));
    if (ordinal < expected && !at(role, ordinal).registered) return ordinal;
  }
  for (int32_t r = 0; r < expected; ++r) {
    if (!at(role, r).registered) return r;
  }
  return expected;  // not reached: the caller checked that a rank is free
}

StatusOr<int32_t> Membership::Register(const v1::RegisterRequest& req) {
  int32_t rank;
  auto it = pods_.find(req.pod_name());
  if (it != pods_.end()) {
    if (it->second.first != req.role()) {
      return InvalidArgumentError("pod " + req.pod_name() + " is registered as " +
                                  RoleName(it->second.first) + " " +
                                  std::to_string(it->second.second) + ", cannot register as " +
                                  RoleName(req.role()));
    }
    rank = it->second.second;
    Reregister(req, rank);
  } else {
    int32_t& count = registered_count(req.role());
    const int32_t expected = size(req.role());
    if (count >= expected) {
      rank = TakeOrphan(req);
      if (rank < 0) {
        return ResourceExhaustedError("the job expects " + std::to_string(expected) + " " +
                                      RoleName(req.role()) + "s and all ranks are taken; pod " +
                                      req.pod_name() + " cannot register");
      }
    } else {
      rank = PreferredFreeRank(req.role(), req.pod_name());
      ++count;
      Member& n = mutable_at(req.role(), rank);
      n.registered = true;
      n.pod_name = req.pod_name();
      n.host = req.host();
      n.gpus = req.gpus();
      n.incarnation = 1;
      n.last_seen = clock_->Now();
      pods_.emplace(req.pod_name(), std::make_pair(req.role(), rank));
      TLOG_INFO << RoleName(req.role()) << " " << rank << " registered: pod " << req.pod_name()
                << " host " << req.host();
    }
  }
  ++registrations_;
  return rank;
}

void Membership::Reregister(const v1::RegisterRequest& req, int32_t rank) {
  Member& n = mutable_at(req.role(), rank);
  if (req.resume() && req.previous_incarnation() > 0 &&
      req.previous_incarnation() <= n.incarnation) {
    // The agent thought the scheduler restarted (its calls failed for a while) and this one
    // already knows it: nothing changes but that the node is seen again.
    if (n.dead) TLOG_INFO << RoleName(req.role()) << " " << rank << " revived by re-registration";
  } else {
    ++n.incarnation;
    if (n.restart_reported) {
      n.restart_reported = false;  // counted when the exit was reported
    } else if (!n.departed) {  // a slot the world left, joining again (growing), is no restart
      ++n.restarts;
      ++restarts_;
    }
    if (n.dead) TLOG_INFO << RoleName(req.role()) << " " << rank << " revived by re-registration";
    if (n.preempted) {
      TLOG_INFO << RoleName(req.role()) << " " << rank << ": the replacement of the stopped pod "
                << req.pod_name() << " registered after "
                << Seconds(clock_->Now() - n.preempted_at) << " s";
    }
    n.preempted = false;
    n.exited = false;
    n.program_reporting = false;  // the new program is judged once it reports
    n.step = -1;
    n.host = req.host();
    n.gpus = req.gpus();
    TLOG_INFO << RoleName(req.role()) << " " << rank << " (pod " << req.pod_name()
              << ") re-registered, incarnation " << n.incarnation;
  }
  n.dead = false;
  n.last_seen = clock_->Now();
}

Status Membership::Ready(const v1::ReportReadyRequest& req) {
  TRELLIS_RETURN_IF_ERROR(Check(req.role(), req.rank(), true));
  if (req.role() == v1::ROLE_SERVER && req.address().empty()) {
    return InvalidArgumentError("server " + std::to_string(req.rank()) +
                                ": address (host:port of the data service) must be set");
  }
  Member& n = mutable_at(req.role(), req.rank());
  n.ready = true;
  n.address = req.address();
  n.last_seen = clock_->Now();
  if (!n.taken_over_by.empty()) n.served_since_takeover = true;
  TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " ready at " << req.address();
  return Status::Ok();
}

Status Membership::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                             bool* revived) {
  TRELLIS_RETURN_IF_ERROR(Check(req.role(), req.rank(), true));
  Member& n = mutable_at(req.role(), req.rank());
  if (req.incarnation() != 0 && req.incarnation() < n.incarnation) {
    return StaleIncarnation(req.role(), req.rank(), req.incarnation(), n.incarnation);
  }
  n.last_seen = clock_->Now();
  n.state = req.state().substr(0, 256);
  *revived = false;
  if (n.dead) {
    n.dead = false;
    TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " (pod " << n.pod_name
              << ") revived by a heartbeat";
    *revived = true;
  }
  for (int32_t r = 0; r < size(v1::ROLE_SERVER); ++r) {
    if (servers_[static_cast<size_t>(r)].dead && !servers_[static_cast<size_t>(r)].departed) {
      FillNode(servers_[static_cast<size_t>(r)], v1::ROLE_SERVER, r, resp->add_dead());
    }
  }
  for (int32_t r = 0; r < size(v1::ROLE_WORKER); ++r) {
    if (workers_[static_cast<size_t>(r)].dead) {
      FillNode(workers_[static_cast<size_t>(r)], v1::ROLE_WORKER, r, resp->add_dead());
    }
  }
  if (n.stalled) {  // liveness.cc: the agent kills and restarts its program
    resp->set_restart_program(true);
    resp->set_restart_reason(n.stall_reason);
  }
  return Status::Ok();
}

int32_t Membership::FinishedWorker(const std::string& pod_name) const {
  auto it = pods_.find(pod_name);
  if (it == pods_.end() || it->second.first != v1::ROLE_WORKER) return -1;
  const Member& w = at(v1::ROLE_WORKER, it->second.second);
  return w.exited && w.last_exit_code == 0 ? it->second.second : -1;
}

bool Membership::AnyWorkerExited() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const Member& w) { return w.registered && w.exited && !w.departed; });
}

Status Membership::ReportExit(const v1::ReportExitRequest& req, std::string* failure) {
  TRELLIS_RETURN_IF_ERROR(Check(req.role(), req.rank(), true));
  Member& n = mutable_at(req.role(), req.rank());
  if (req.incarnation() != 0 && req.incarnation() < n.incarnation) {
    return StaleIncarnation(req.role(), req.rank(), req.incarnation(), n.incarnation);
  }
  n.last_exit_code = req.exit_code();
  n.last_seen = clock_->Now();
  n.ready = false;  // the program is gone; a restarted one reports ready again
  NoteExit(n, req.will_restart(), n.last_seen);
  std::string what = std::string(RoleName(req.role())) + " " + std::to_string(req.rank()) +
                     " (pod " + n.pod_name + ")";
  // Once every worker finished, a stop is the end of the run (servers and launchers stop
  // their pods then), not a preemption to wait out.
  const bool finished = std::all_of(workers_.begin(), workers_.end(), [](const Member& w) {
    return (w.registered && w.exited && w.last_exit_code == 0) || (w.departed && (!w.registered || w.exited));
  });
  if (req.preempted() && !req.will_restart() && !finished) {
    // A pod deletion or eviction, not a failure of the program: keep the rank for the
    // replacement pod (same name), which registers as the next incarnation and rejoins.
    n.preempted = true;
    n.preempted_at = n.last_seen;
    TLOG_WARN << what << " was stopped from outside (" << DescribeExitCode(req.exit_code())
              << "; its pod was deleted or evicted): keeping its rank for the replacement pod for "
              << Seconds(config_.replacement_timeout) << " s";
  } else if (req.will_restart()) {
    ++n.restarts;
    ++n.program_restarts;
    ++restarts_;
    n.restart_reported = true;
    TLOG_WARN << what << " exited with " << DescribeExitCode(req.exit_code())
              << ", restarting (restart " << n.restarts << ")";
  } else {
    n.exited = true;
    TLOG_INFO << what << " exited for good: " << DescribeExitCode(req.exit_code());
    if (req.role() == v1::ROLE_WORKER && req.exit_code() != 0) {
      *failure = what + " failed: " + DescribeExitCode(req.exit_code());
      if (!req.message().empty()) *failure += ": " + req.message().substr(0, 1024);
    }
  }
  return Status::Ok();
}

std::string Membership::TakeOverServer(int32_t rank, int32_t by) {
  Member& n = servers_[static_cast<size_t>(rank)];
  const Member& a = servers_[static_cast<size_t>(by)];
  const std::string pod = TakeOverPodName(a.pod_name, rank);
  pods_.erase(n.pod_name);
  if (n.lost_pod.empty()) n.lost_pod = n.pod_name;
  n.taken_over_by = a.pod_name;
  n.pod_name = pod;
  n.served_since_takeover = false;
  n.host = a.host;
  n.ready = false;
  n.address.clear();
  n.dead = false;
  n.exited = false;
  n.preempted = false;
  // A restart of the rank, counted now (its registration is not counted again); the others wait
  // for it as for any restart, up to the registration timeout (liveness.cc).
  ++n.restarts;
  ++restarts_;
  n.restart_reported = true;
  const TimePoint now = clock_->Now();
  n.restarting = true;
  n.restarting_since = now;
  n.last_seen = now;
  pods_[pod] = std::make_pair(v1::ROLE_SERVER, rank);
  return pod;
}

void Membership::SetServerDeparted(int32_t rank, bool departed) {
  Member& n = servers_[static_cast<size_t>(rank)];
  n.departed = departed;
  if (!departed || n.taken_over_by.empty()) return;
  pods_.erase(n.pod_name);
  n.pod_name = n.lost_pod;
  pods_[n.pod_name] = std::make_pair(v1::ROLE_SERVER, rank);
  n.taken_over_by.clear();
  n.lost_pod.clear();
}

std::vector<int32_t> Membership::TakenOverBy(const std::string& pod_name) const {
  std::vector<int32_t> ranks;
  if (pod_name.empty()) return ranks;
  for (size_t r = 0; r < servers_.size(); ++r) {
    if (servers_[r].taken_over_by == pod_name) ranks.push_back(static_cast<int32_t>(r));
  }
  return ranks;
}

Status Membership::Leave(const v1::LeaveRequest& req) {
  TRELLIS_RETURN_IF_ERROR(Check(req.role(), req.rank(), true));
  Member& n = mutable_at(req.role(), req.rank());
  n.exited = true;
  TLOG_INFO << RoleName(req.role()) << " " << req.rank() << " (pod " << n.pod_name << ") left";
  return Status::Ok();
}

void Membership::AddTo(SchedulerStats* s) const {
  s->registrations += registrations_;
  s->restarts += restarts_;
  s->dead_detected += dead_detected_;
  s->stalls += stalls_;
  int role = 0;
  for (const auto* nodes : {&servers_, &workers_}) {
    for (const Member& n : *nodes) {
      s->registered[role] += n.registered ? 1 : 0;
      s->dead[role] += n.dead ? 1 : 0;
      s->restarts_of[role] += n.restarts;
    }
    ++role;
  }
}

}  // namespace trellis
