// Membership: liveness. A member's agent heartbeats (silent past heartbeat_timeout: dead; an
// elastic job's worker silent past replacement_timeout: lost); a preempted member's replacement
// must register within replacement_timeout. And stalls
// (docs/scheduler.md#stalls): a program that stops making progress -- SIGSTOP, a deadlock, a hung
// GPU -- while its agent heartbeats on. The programs report for themselves: servers and workers
// ping with their identity (SchedulerWatch), workers report their step (ReportProgress). A program
// silent for liveness_timeout, or a worker whose step stands still for progress_timeout while
// another worker is ahead of it (waiting for it), is stalled: logged by name, shown in the view,
// and its agent is told (HeartbeatResponse.restart_program) to kill and restart it under its
// restart policy. Until its new program pings, it is `restarting`, and PingResponse lists it so
// the other workers wait instead of failing.
#include <cstdio>

#include "common/base/logging.h"
#include "scheduler/membership.h"

namespace trellis {

namespace {

// "2.3" (seconds, one decimal: what a person reads in a log line)
std::string Secs(Clock::TimePoint::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", Seconds(d));
  return buf;
}

}  // namespace

bool Membership::NoteProgram(v1::Role role, int32_t rank, int64_t incarnation, TimePoint now) {
  if (!KnownRole(role) || rank < 0 || rank >= size(role)) return false;
  Member& n = mutable_at(role, rank);
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

void Membership::NoteStep(int32_t rank, int64_t incarnation, int64_t step, TimePoint now) {
  if (rank < 0 || rank >= size(v1::ROLE_WORKER)) return;
  Member& n = workers_[static_cast<size_t>(rank)];
  if (n.program_reporting && incarnation == n.incarnation && step != n.step) {
    n.step = step;
    n.step_since = now;
  }
}

void Membership::FillRestarting(v1::PingResponse* resp) const {
  for (int32_t r = 0; r < size(v1::ROLE_SERVER); ++r) {
    if (servers_[static_cast<size_t>(r)].restarting) resp->add_restarting_servers(r);
  }
  for (int32_t r = 0; r < size(v1::ROLE_WORKER); ++r) {
    const Member& w = workers_[static_cast<size_t>(r)];
    // An elastic job's silent worker is lost at the registration timeout (SweepHeartbeats):
    // until then the others wait for it as for one restarting, instead of failing their step.
    const bool awaited = config_.elastic.enabled && w.dead && !w.exited && !w.departed;
    if (w.restarting || awaited) resp->add_restarting_workers(r);
  }
}

void Membership::NoteExit(Member& n, bool will_restart, TimePoint now) {
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

void Membership::MarkStalled(Member& n, v1::Role role, int32_t rank, std::string reason,
                             TimePoint now) {
  n.stalled = true;
  n.stall_reason = std::move(reason);
  n.restarting = true;
  n.restarting_since = now;
  ++stalls_;
  TLOG_WARN << RoleName(role) << " " << rank << " (pod " << n.pod_name << ") stalled: "
            << n.stall_reason << "; its agent kills and restarts it (restart policy), the others "
            << "wait for it";
}

void Membership::SweepLiveness(TimePoint now, bool* changed, std::vector<Loss>* losses) {
  SweepHeartbeats(servers_, v1::ROLE_SERVER, now, changed, losses);
  SweepHeartbeats(workers_, v1::ROLE_WORKER, now, changed, losses);
  SweepStalls(servers_, v1::ROLE_SERVER, now, changed, losses);
  SweepStalls(workers_, v1::ROLE_WORKER, now, changed, losses);
}

void Membership::SweepHeartbeats(std::vector<Member>& nodes, v1::Role role, TimePoint now,
                                 bool* changed, std::vector<Loss>* losses) {
  for (size_t r = 0; r < nodes.size(); ++r) {
    Member& n = nodes[r];
    if (!n.registered || n.exited) continue;
    if (n.dead) {
      // An elastic job does not wait for ever for a worker whose agent fell silent (its node
      // gone, the pod frozen): past the registration timeout it is lost, the job goes on. With
      // elastic servers a silent server likewise: another server's pod takes it over.
      const bool elastic = role == v1::ROLE_WORKER ? config_.elastic.enabled : config_.servers_elastic();
      if (elastic && !n.departed && now - n.last_seen > config_.replacement_timeout) {
        n.exited = true;
        *changed = true;
        losses->push_back({role, static_cast<int32_t>(r),
                           std::string(RoleName(role)) + " " + std::to_string(r) + " (pod " + n.pod_name + ") was silent for " +
                               Secs(now - n.last_seen) +
                               " s (no heartbeat from its agent: its node gone?) and did not come back "
                               "within registrationTimeoutSeconds (" +
                               Secs(config_.replacement_timeout) + " s)",
                           /*silent=*/true});
      }
      continue;
    }
    if (n.preempted) {  // known to be away: its own deadline, not the heartbeat's
      if (now - n.preempted_at > config_.replacement_timeout) {
        n.exited = true;
        *changed = true;
        losses->push_back({role, static_cast<int32_t>(r),
                           std::string(RoleName(role)) + " " + std::to_string(r) + " (pod " +
                               n.pod_name + ") was stopped from outside (pod deleted or evicted) " +
                               "and no replacement pod registered within " +
                               std::to_string(config_.replacement_timeout.count() / 1000) + " s"});
      }
      continue;
    }
    if (now - n.last_seen > config_.heartbeat_timeout) {
      n.dead = true;
      ++dead_detected_;
      *changed = true;
      TLOG_WARN << RoleName(role) << " " << r << " (pod " << n.pod_name << ") silent for "
                << Seconds(now - n.last_seen) << " s: marked dead";
    }
  }
}

void Membership::SweepStalls(std::vector<Member>& nodes, v1::Role role, TimePoint now,
                             bool* changed, std::vector<Loss>* losses) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    Member& n = nodes[i];
    const int32_t r = static_cast<int32_t>(i);
    if (!n.registered || n.exited || n.preempted) continue;
    if (n.restarting && now - n.restarting_since > config_.replacement_timeout) {
      losses->push_back({role, r,
                         std::string(RoleName(role)) + " " + std::to_string(r) + " (pod " +
                             n.pod_name + ") " +
                             (n.stalled ? "stalled (" + n.stall_reason + ")" : "was restarted") +
                             " and its program did not come back within " +
                             std::to_string(config_.replacement_timeout.count() / 1000) + " s"});
      n.restarting = false;
      *changed = true;
      continue;
    }
    if (n.dead || n.stalled || !n.program_reporting) continue;
    if (config_.liveness_timeout.count() > 0 && now - n.program_seen > config_.liveness_timeout) {
      MarkStalled(n, role, r,
                  "its program sent no liveness for " + Secs(now - n.program_seen) +
                      " s (livenessTimeoutSeconds " + Secs(config_.liveness_timeout) + ")",
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
      const Member& o = nodes[j];
      if (j == i || !o.registered || o.exited || o.dead || o.step <= n.step) continue;
      MarkStalled(n, role, r,
                  "its step " + std::to_string(n.step) + " has not advanced for " +
                      Secs(now - n.step_since) + " s while worker " + std::to_string(j) +
                      " is at step " + std::to_string(o.step) +
                      " waiting for it (progressTimeoutSeconds " +
                      Secs(config_.progress_timeout) + ")",
                  now);
      *changed = true;
      break;
    }
  }
}

}  // namespace trellis
