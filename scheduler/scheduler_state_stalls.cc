// Stalls (docs/scheduler.md#stalls): a program that stops making progress -- SIGSTOP, a
// deadlock, a hung GPU -- while its agent heartbeats on. The programs report for themselves:
// servers and workers ping with their identity (SchedulerWatch), workers report their step
// (ReportProgress). A program silent for liveness_timeout, or a worker whose step stands still
// for progress_timeout while another worker is ahead of it (waiting for it), is stalled: logged
// by name, shown in the view, and its agent is told (HeartbeatResponse.restart_program) to kill
// and restart it under its restart policy. Until its new program pings, it is `restarting`, and
// PingResponse lists it so the other workers wait instead of failing.
#include <algorithm>
#include <cstdio>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"
#include "scheduler/state_internal.h"

namespace trellis {

using namespace state_internal;

namespace {

// "2.3" (seconds, one decimal: what a person reads in a log line)
std::string Secs(Clock::TimePoint::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", Seconds(d));
  return buf;
}

}  // namespace

v1::PingResponse SchedulerState::Ping(const v1::PingRequest& req) {
  Deferred deferred;
  v1::PingResponse resp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    resp.set_scheduler_id(instance_id_);
    resp.set_recovering(recovering_);
    if (KnownRole(req.role()) &&
        NoteProgramLocked(req.role(), req.rank(), req.incarnation(), clock_->Now())) {
      ChangedLocked(&deferred);
    }
    for (int32_t r = 0; r < config_.num_servers; ++r) {
      if (servers_[static_cast<size_t>(r)].restarting) resp.add_restarting_servers(r);
    }
    for (int32_t r = 0; r < config_.num_workers; ++r) {
      if (workers_[static_cast<size_t>(r)].restarting) resp.add_restarting_workers(r);
    }
  }
  Run(deferred);
  return resp;
}

void SchedulerState::ProgramProgress(int32_t rank, int64_t incarnation, int64_t step) {
  Deferred deferred;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TimePoint now = clock_->Now();
    if (NoteProgramLocked(v1::ROLE_WORKER, rank, incarnation, now)) ChangedLocked(&deferred);
    if (rank >= 0 && rank < config_.num_workers) {
      Node& n = workers_[static_cast<size_t>(rank)];
      if (n.program_reporting && incarnation == n.incarnation && step != n.step) {
        n.step = step;
        n.step_since = now;
      }
    }
  }
  Run(deferred);
}

bool SchedulerState::NoteProgramLocked(v1::Role role, int32_t rank, int64_t incarnation,
                                       TimePoint now) {
  const int32_t count = role == v1::ROLE_SERVER ? config_.num_servers : config_.num_workers;
  if (rank < 0 || rank >= count) return false;
  Node& n = NodeLocked(role, rank);
  // An old incarnation (a program its agent is killing) or a node gone: not this program.
  if (!n.registered || n.exited || incarnation != n.incarnation) return false;
  n.program_reporting = true;
  n.program_seen = now;
  if (!n.restarting || n.stalled) return false;
  n.restarting = false;
  n.stall_reason.clear();
  TLOG_INFO << RoleName(role) << " " << rank << " (pod " << n.pod_name
            << ") is back: incarnation " << n.incarnation << " reports, "
            << Seconds(now - n.restarting_since) << " s after its restart began";
  return true;
}

void SchedulerState::NoteExitLocked(Node& n, bool will_restart, TimePoint now) {
  n.program_reporting = false;
  n.step = -1;
  n.stalled = false;  // the agent acted: the stalled program is gone
  if (will_restart) {
    if (!n.restarting) n.restarting_since = now;
    n.restarting = true;
  } else {
    n.restarting = false;
  }
}

void SchedulerState::MarkStalledLocked(v1::Role role, int32_t rank, std::string reason,
                                       TimePoint now) {
  Node& n = NodeLocked(role, rank);
  n.stalled = true;
  n.stall_reason = std::move(reason);
  n.restarting = true;
  n.restarting_since = now;
  ++stats_.stalls;
  TLOG_WARN << RoleName(role) << " " << rank << " (pod " << n.pod_name << ") stalled: "
            << n.stall_reason << "; its agent kills and restarts it (restart policy), the others "
            << "wait for it";
}

void SchedulerState::SweepStallsLocked(TimePoint now, bool* changed, Deferred* deferred) {
  if (recovering_) return;  // members are coming back; nobody is judged until they are
  auto judge = [&](std::vector<Node>& nodes, v1::Role role) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      Node& n = nodes[i];
      const int32_t r = static_cast<int32_t>(i);
      if (!n.registered || n.exited || n.preempted) continue;
      if (n.restarting && now - n.restarting_since > config_.replacement_timeout) {
        FailJobLocked(std::string(RoleName(role)) + " " + std::to_string(r) + " (pod " +
                          n.pod_name + ") " + (n.stalled ? "stalled (" + n.stall_reason + ")" : "was restarted") +
                          " and its program did not come back within " +
                          std::to_string(config_.replacement_timeout.count() / 1000) + " s",
                      deferred);
        n.restarting = false;
        *changed = true;
        continue;
      }
      if (n.dead || n.stalled || !n.program_reporting) continue;
      if (config_.liveness_timeout.count() > 0 && now - n.program_seen > config_.liveness_timeout) {
        MarkStalledLocked(role, r,
                          "its program sent no liveness for " + Secs(now - n.program_seen) +
                              " s (livenessTimeoutSeconds " +
                              Secs(config_.liveness_timeout) + ")",
                          now);
        *changed = true;
        continue;
      }
      if (role != v1::ROLE_WORKER || config_.progress_timeout.count() <= 0 || n.step < 0 ||
          now - n.step_since <= config_.progress_timeout) {
        continue;
      }
      // Synchronous training: a worker ahead of it waits for its pushes.
      for (size_t j = 0; j < nodes.size(); ++j) {
        const Node& o = nodes[j];
        if (j == i || !o.registered || o.exited || o.dead || o.step <= n.step) continue;
        MarkStalledLocked(role, r,
                          "its step " + std::to_string(n.step) + " has not advanced for " +
                              Secs(now - n.step_since) + " s while worker " +
                              std::to_string(j) + " is at step " + std::to_string(o.step) +
                              " waiting for it (progressTimeoutSeconds " +
                              Secs(config_.progress_timeout) + ")",
                          now);
        *changed = true;
        break;
      }
    }
  };
  judge(servers_, v1::ROLE_SERVER);
  judge(workers_, v1::ROLE_WORKER);
}

}  // namespace trellis
