// The job's members: which pod holds which server or worker rank, in which incarnation, and how
// each one is doing -- ready (its address), exited, preempted, dead (its agent's heartbeats
// stopped) or stalled (its program's own reports stopped; liveness.cc). Ranks and the counts of
// each role live here alone, so a job whose members come and go changes this one object.
//
// Not thread-safe: SchedulerState calls it with its one lock held. Nothing here answers a
// waiting call; the caller learns from the return values what changed (the cluster view's
// version, a failure of the job).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/base/status.h"
#include "scheduler/clock.h"
#include "scheduler/scheduler_config.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

// "server", "worker".
inline const char* RoleName(v1::Role role) { return role == v1::ROLE_SERVER ? "server" : "worker"; }
inline bool KnownRole(v1::Role role) { return role == v1::ROLE_SERVER || role == v1::ROLE_WORKER; }

// "exit code 137 (killed by SIGKILL)", "exit code 1".
std::string DescribeExitCode(int32_t code);

class Membership {
 public:
  using TimePoint = Clock::TimePoint;

  struct Member {
    bool registered = false;
    std::string pod_name;
    std::string host;
    int32_t gpus = 0;
    std::string address;
    bool ready = false;
    bool dead = false;
    bool exited = false;
    int32_t last_exit_code = 0;
    int64_t incarnation = 0;
    int32_t restarts = 0;
    int32_t program_restarts = 0;   // the part of `restarts` its agents did inside their pods
    bool restart_reported = false;  // ReportExit(will_restart) already counted the next restart
    // Stopped from outside (pod deleted or evicted) under a policy that replaces the pod: the
    // rank waits for the replacement's registration until preempted_at + replacement_timeout.
    bool preempted = false;
    TimePoint preempted_at{};
    TimePoint last_seen{};
    std::string state;  // free-form, from heartbeats
    // Stalls (liveness.cc). The program's own last ping or progress report in this
    // incarnation; a program that never reported is never judged.
    bool program_reporting = false;
    TimePoint program_seen{};
    int64_t step = -1;       // the last step the program reported (workers); -1: none
    TimePoint step_since{};  // when `step` was first reported
    bool stalled = false;    // its agent is told to restart it (HeartbeatResponse)
    std::string stall_reason;
    bool restarting = false;  // stalled, or exited and restarting; until its program pings again
    TimePoint restarting_since{};
    // Elastic jobs: the rank left the job's world (scaled down; world_plan.h). Its program's
    // exit is a departure, not the job's end.
    bool departed = false;
    // Elastic servers (docs/elastic.md#losing-a-server): the rank was lost for good and pod
    // `taken_over_by` runs its program since (TakeOverServer); `lost_pod` is the pod it had
    // first. `served_since_takeover`: the takeover's program reported ready.
    std::string taken_over_by;
    std::string lost_pod;
    bool served_since_takeover = false;
  };

  // A member given up on (liveness.cc): the job fails, or an elastic job goes on without a
  // worker (SchedulerState::LoseWorkerLocked).
  struct Loss {
    v1::Role role;
    int32_t rank;
    std::string why;
    bool silent = false;  // its agent fell silent (LostWorker.silent)
  };

  // REQUIRES: ValidateSchedulerConfig(config).ok(); `config` and `clock` outlive the membership.
  Membership(const SchedulerConfig& config, const Clock* clock);

  // How many ranks the role has.
  int32_t size(v1::Role role) const {
    return static_cast<int32_t>(role == v1::ROLE_SERVER ? servers_.size() : workers_.size());
  }
  // INVALID_ARGUMENT for an unknown role or a rank out of range; NOT_FOUND for a rank nobody
  // registered (when it must be).
  Status Check(v1::Role role, int32_t rank, bool must_be_registered) const;
  // REQUIRES: Check(role, rank, false).ok().
  const Member& at(v1::Role role, int32_t rank) const;
  // Registered, and neither dead, exited nor preempted.
  bool Live(v1::Role role, int32_t rank) const;
  // Every rank registered (or resized away) and every server ready: the cluster view is complete.
  bool Complete() const;
  bool AllRegistered() const;
  // Some worker's program exited for good (finished, or failed) other than one that left the
  // world: the job is ending.
  bool AnyWorkerExited() const;
  // The worker rank left the job's world (elastic jobs), or came back into it (growing).
  // REQUIRES: a worker rank in range.
  void SetDeparted(int32_t rank, bool departed) { workers_[rank].departed = departed; }
  // Likewise a server rank (a server resize; world_plan.h). A rank taken over that a shrink
  // removes gets its own pod name back, so a later grow starts it as itself.
  // REQUIRES: a server rank in range.
  void SetServerDeparted(int32_t rank, bool departed);
  // The servers in force: ranks 0..n-1, those not departed.
  int32_t ServersInForce() const;
  // Server `rank` (any slot) is live and reported ready.
  bool ServerReady(int32_t rank) const;
  // Registered workers, and those resized away that never registered here (after a restart).
  int32_t WorkersAccountedFor() const;
  // Registered servers, and the slots outside the world.
  int32_t ServersAccountedFor() const;
  // The worker ranks that have not left the world: who a barrier waits for.
  int32_t WorldWorkers() const {
    return static_cast<int32_t>(std::count_if(workers_.begin(), workers_.end(),
                                              [](const Member& w) { return !w.departed; }));
  }
  // `pod_name` holds a worker rank whose program exited 0 (finished): its rank, else -1.
  int32_t FinishedWorker(const std::string& pod_name) const;
  void FillView(v1::ClusterView* view) const;  // the members' part of the view

  // The request's own fields (role, pod name, gpus, job name), before any state is looked at.
  static Status CheckRequest(const v1::RegisterRequest& req, const SchedulerConfig& config);
  // Register, first time or again (RegisterRequest.pod_name known here): ranks in arrival order
  // per role, a pod named "<job>-<role>-<i>" taking rank i when free; the same pod name gets its
  // old rank and incarnation + 1. More pods of a role than expected take an orphaned rank (one
  // whose member never came back after a scheduler restart) or get RESOURCE_EXHAUSTED.
  // Returns the rank. REQUIRES: CheckRequest(req).ok(); not an adoption (below).
  StatusOr<int32_t> Register(const v1::RegisterRequest& req);
  // After a scheduler restart (membership_restart.cc). A pod unknown here that held a rank under
  // the scheduler before this one (previous_incarnation > 0, its pod name not Known):
  // CheckAdoptable says whether it may have the rank back, Adopt gives it back (returns it).
  bool Known(const std::string& pod_name) const { return pods_.count(pod_name) != 0; }
  Status CheckAdoptable(const v1::RegisterRequest& req) const;
  int32_t Adopt(const v1::RegisterRequest& req);
  // The end of the recovery grace: every rank nobody registered again is marked dead (the pod
  // may still come back), and everyone's heartbeat timeout starts afresh. Returns how many were
  // missing, and names the first 10 in `names`.
  int MarkMissingDead(TimePoint now, std::string* names);
  // Elastic servers: server `rank`, lost for good, is taken over by the pod of live server `by`
  // (REQUIRES: both in range, `by` live and not `rank`). The rank's pod name becomes
  // TakeOverPodName(that pod, rank), the name the takeover's agent registers under (the rank's
  // next incarnation, a restart); until it is back the others wait for it as for a restart.
  // Returns the new pod name.
  std::string TakeOverServer(int32_t rank, int32_t by);
  // The server ranks pod `pod_name` took over (ascending).
  std::vector<int32_t> TakenOverBy(const std::string& pod_name) const;
  // Servers' addresses a worker handed back (Resume), for those that have not reported ready.
  void AdoptServerAddresses(const v1::ResumeRequest& req);

  Status Ready(const v1::ReportReadyRequest& req);
  // A heartbeat: the node is seen (revived if dead). Fills the dead nodes and whether the agent
  // must restart its program. `revived`: the view changed.
  Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp, bool* revived);
  // An exit report. A worker that exits for good with a failure fails the job: `failure` is then
  // the job's failure message (else empty).
  Status ReportExit(const v1::ReportExitRequest& req, std::string* failure);
  Status Leave(const v1::LeaveRequest& req);

  // Liveness (liveness.cc). A program's own ping or progress report under `incarnation`: a
  // restarting node is back then (returns true: the view changed). Unknown ranks are ignored.
  bool NoteProgram(v1::Role role, int32_t rank, int64_t incarnation, TimePoint now);
  // A worker program's step (after NoteProgram); old incarnations are ignored.
  void NoteStep(int32_t rank, int64_t incarnation, int64_t step, TimePoint now);
  void FillRestarting(v1::PingResponse* resp) const;
  // Marks nodes silent past the heartbeat timeout dead and programs stalled. Appends to
  // `losses` the members given up on, in the order found (a preempted pod not replaced in time,
  // a restart that did not come back); sets *changed when the view changed. Not while the job
  // recovers after a scheduler restart: the caller does not call it then.
  void SweepLiveness(TimePoint now, bool* changed, std::vector<Loss>* losses);

  void AddTo(SchedulerStats* stats) const;

 private:
  Member& mutable_at(v1::Role role, int32_t rank);
  int32_t& registered_count(v1::Role role) {
    return role == v1::ROLE_SERVER ? registered_servers_ : registered_workers_;
  }
  void FillNode(const Member& n, v1::Role role, int32_t rank, v1::NodeInfo* out) const;
  int32_t PreferredFreeRank(v1::Role role, const std::string& pod_name) const;
  // A new pod when every rank is taken: a rank whose member never came back after a restart
  // (registered, no pod name, dead) is given to it as a restart; -1: none.
  int32_t TakeOrphan(const v1::RegisterRequest& req);
  void Reregister(const v1::RegisterRequest& req, int32_t rank);
  // Liveness (liveness.cc).
  void SweepHeartbeats(std::vector<Member>& nodes, v1::Role role, TimePoint now, bool* changed,
                       std::vector<Loss>* losses);
  void SweepStalls(std::vector<Member>& nodes, v1::Role role, TimePoint now, bool* changed,
                   std::vector<Loss>* losses);
  void NoteExit(Member& n, bool will_restart, TimePoint now);
  void MarkStalled(Member& n, v1::Role role, int32_t rank, std::string reason, TimePoint now);

  const SchedulerConfig& config_;
  const Clock* const clock_;
  std::vector<Member> servers_;  // index = rank
  std::vector<Member> workers_;  // index = rank
  int32_t registered_servers_ = 0;
  int32_t registered_workers_ = 0;
  std::unordered_map<std::string, std::pair<v1::Role, int32_t>> pods_;  // pod name -> rank
  int64_t registrations_ = 0;
  int64_t restarts_ = 0;
  int64_t dead_detected_ = 0;
  int64_t stalls_ = 0;
};

}  // namespace trellis
