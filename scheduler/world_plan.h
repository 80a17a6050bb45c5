// Elastic jobs (docs/elastic.md): which workers take part in the job's steps, and the resize
// under way.
//
// A resize is asked for (Resize) and announced in every Ping (resize_epoch). Each member of the
// current world then reports the step s it reached at its next step boundary (Reach; the
// boundary is Checkpointer::Commit, after step s and before any push of s+1), without waiting,
// and goes on with step s+1. At its next boundary (after s+1) it waits for the decision. Once
// every member has reported, the resize is decided: the new world starts at the furthest step
// reported + 2, so every member learns it no later than the boundary where it must switch, and
// none has pushed a step of the new world in the old one. That cannot deadlock: a member that
// waits has pushed every step up to the one after its report, so every other member can finish
// the step it is in and reach a boundary too. Members are at most a step apart, so the new world
// starts two or three steps after the first report.
//
// Growing (docs/elastic.md#growing) brings in slots outside the world, lowest first: those it
// left, and beyond the job's first size up to maxWorkers those never used. A joiner is a new
// incarnation of its slot (or its first). The resize is announced to the members only once every
// joiner's program asked to join (Reach with a negative step: it waits for the decision), so the
// members never wait on a joiner that is not running yet; the joiners do not report steps, and
// the decision is the members' as above. A joiner then takes the members' model at step F-1
// through the rejoin path (a member's commit of F-1: none of them can finish step F without the
// joiners' pushes, so that commit stays the newest until the joiner has it).
//
// Losing a worker (docs/elastic.md#losing-a-worker): a member that is gone for good (Lose) cannot
// report, and the others may be blocked inside a step waiting for its pushes. It is left out at
// once: the resize under way (or a new one, announced at once) drops it from its members and
// decides without its report, and the servers learn of the loss from their pings (lost()), so
// they stop waiting for its pushes from each slice's first step it did not push. The others then
// reach boundaries, report and switch as above.
//
// Resizing the servers (docs/elastic.md#servers) is a resize with the same members and another
// server count (WorldInfo.servers), one kind at a time. A grow is announced once every server it
// adds reported ready (ServerReady), so no member waits on a server not serving yet; the
// decision is as above, and at the boundary every member moves the slices the new shard map
// gives another server (worker-lib/src/server_resize.h). Servers are always ranks 0..n-1: a
// shrink removes the highest.
//
// Members are worker slots (their rank for their life in the job); a program's rank is its index
// among the members.
//
// Not thread-safe: SchedulerState calls it with its one lock held.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "scheduler/scheduler_config.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

// Wall-clock milliseconds since the epoch: when a resize was asked for and decided.
inline int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class WorldPlan {
 public:
  // Workers 0..workers-1 from step 1, of `slots` (>= workers: the ranks the job may ever have;
  // those beyond `workers` start outside the world), and `servers` servers (bounds.min_servers
  // and max_servers 0: fixed).
  WorldPlan(int32_t workers, int32_t slots, ElasticBounds bounds, int32_t servers = 1);

  const ElasticBounds& bounds() const { return bounds_; }
  const v1::WorldInfo& current() const { return current_; }
  int32_t size() const { return current_.members_size(); }
  bool IsMember(int32_t slot) const;
  // A slot the world left (scaled down): its program's exit is a departure, not the job's end.
  bool Departed(int32_t slot) const;
  // The resize under way (0: none).
  int64_t pending_epoch() const { return pending_ ? pending_->epoch : 0; }
  // The resize the members are told of (pings): one under way, a grow only once every joiner
  // asked to join. 0: none.
  int64_t announced_epoch() const;
  // Whether `slot` joins in the resize under way (a grow brings it back).
  bool Joining(int32_t slot) const;
  // The servers in force (WorldInfo.servers, or the job's first count).
  int32_t servers() const { return current_.servers() > 0 ? current_.servers() : first_servers_; }
  // The servers the resize under way makes (0: none, or not a server resize).
  int32_t pending_servers() const { return pending_ ? pending_->servers : 0; }
  // The members of the resize under way (ascending; empty: none).
  std::vector<int32_t> pending_members() const;
  // Every resize decided so far (the newest last): at most the last kKeptResizes.
  const std::vector<v1::ResizeInfo>& resizes() const { return resizes_; }
  static constexpr size_t kKeptResizes = 16;

  // Resize to `workers` at `now_unix_ms`. FAILED_PRECONDITION: the job is not elastic, or another
  // resize is under way; INVALID_ARGUMENT: outside [minWorkers, maxWorkers] (or more than its
  // slots). The same size: nothing to do (answered with the current epoch).
  StatusOr<v1::ResizeResponse> Resize(int32_t workers, const std::string& reason,
                                      int64_t now_unix_ms);

  // Resize the servers to `servers` (one kind at a time: the members stay). `not_ready`: the
  // server ranks it adds that have not reported ready (the grow is announced once they did:
  // ServerReady). Errors as Resize's, naming spec.elastic.minServers/maxServers.
  StatusOr<v1::ResizeResponse> ResizeServers(int32_t servers, const std::set<int32_t>& not_ready,
                                             const std::string& reason, int64_t now_unix_ms);
  // Server `rank` reported ready: returns whether the server grow under way is announced now.
  bool ServerReady(int32_t rank, int64_t now_unix_ms);

  // A member's report of the step it reached (ReachStepRequest), or a joiner's ask to join (any
  // step). Returns whether the resize of `epoch` is decided (then *world is the new world and
  // `now_unix_ms` its decision time). An epoch already decided answers that world (a repeated
  // report). INVALID_ARGUMENT: neither a member nor a joiner, a member's negative step;
  // FAILED_PRECONDITION: no such resize.
  StatusOr<bool> Reach(int32_t slot, int64_t epoch, int64_t step, int64_t now_unix_ms,
                       v1::WorldInfo* world);

  // Decides the resize under way when every member still here reported (after a Lose, which
  // may leave nobody to wait for); as Reach's answer.
  bool DecideIfReported(int64_t now_unix_ms, v1::WorldInfo* world);

  // A restarted scheduler (docs/elastic.md#what-survives-what): `world`, handed back by a
  // worker, when it is newer than the current one; the slots outside it have departed.
  // INVALID_ARGUMENT: members that are not ascending worker slots of this job, or out of
  // spec.elastic's bounds. Returns whether it was adopted (an older or equal epoch is not).
  StatusOr<bool> Adopt(const v1::WorldInfo& world);

  // A joiner's program exited (`exit`: how) before it asked to join: the grow is given up at once,
  // naming it. Returns why (empty: `slot` is no joiner still to ask).
  std::string JoinerExited(int32_t slot, const std::string& exit);
  // A server that the server grow under way adds exited for good (`exit`: how) before the grow
  // was announced: the grow is given up at once, naming it. Returns why (empty: `rank` is no
  // server it still waits for).
  std::string ServerExited(int32_t rank, const std::string& exit);

  // `slot`, a member of the world (or a joiner that asked to join), is gone for good (`why`):
  // the job goes on without it (above). Returns whether it was lost; false: not in the world
  // (resized away already, or a joiner still to ask: JoinerExited), nothing to do.
  // FAILED_PRECONDITION naming spec.elastic.minWorkers: fewer would remain (the job fails).
  // REQUIRES: bounds().enabled.
  // `silent`: lost while its agent was silent (LostWorker.silent).
  StatusOr<bool> Lose(int32_t slot, const std::string& why, int64_t now_unix_ms, bool silent = false);
  // The workers lost for good and not brought back by a later world (the servers' pings).
  const std::vector<v1::LostWorker>& lost() const { return lost_; }
  bool IsLost(int32_t slot) const;

  // The program of `slot`, lost for good (lost()) and not brought back yet, came back and asks
  // to join world `epoch` (a late replacement: a pod made again after its rank was lost, a
  // restart that took longer than registrationTimeoutSeconds). The world grows back to take it
  // in: a resize to size() + 1 whose one joiner is `slot`, as a grow asked for would be, with
  // `slot` counted as asking already. Returns whether it was started; false: `slot` is not lost,
  // a resize is under way, `epoch` is not the next one, or the world has maxWorkers.
  // REQUIRES: bounds().enabled.
  bool GrowBack(int32_t slot, int64_t epoch, int64_t now_unix_ms);

  // A resize no member has reported a step for within `limit_ms` of being asked for is given
  // up: a joiner did not start, or the workers' program never reaches a step boundary the
  // scheduler hears of (it does not use the Checkpointer's EndStep or Commit). Returns why, once
  // (empty: nothing given up); the job goes on in its world and may be asked again.
  std::string AbandonUnreported(int64_t now_unix_ms, int64_t limit_ms);
  static constexpr int64_t kUnreportedLimitMs = 60000;

 private:
  struct Pending {
    int64_t epoch = 0;
    std::vector<int32_t> members;       // ascending
    std::vector<int32_t> joiners;       // the slots that join (growing)
    std::set<int32_t> joined;           // the joiners whose program asked to join
    std::optional<int64_t> announced_unix_ms;  // when the members were told (pings); none: not yet
    std::map<int32_t, int64_t> reached;  // member -> the step it reported
    std::set<int32_t> lost;              // members of the current world not waited for (Lose)
    int32_t servers = 0;                 // a server resize: the servers it makes
    std::set<int32_t> servers_waited;    // a server grow: the servers added not ready yet
    v1::ResizeInfo info;
  };
  // "a resize to 3 workers", "a resize to 2 servers".
  std::string Describe(const Pending& p) const;

  // A resize to `workers` (> size(), <= the slots) into the lowest slots outside the world, or
  // into `only` when given.
  std::unique_ptr<Pending> Grow(int32_t workers, std::optional<int32_t> only);
  // Drops the lost workers `world` brings back (a grow into their slots).
  void ForgetLostIn(const v1::WorldInfo& world);

  const ElasticBounds bounds_;
  const int32_t first_servers_;
  v1::WorldInfo current_;
  std::vector<bool> departed_;  // per slot
  std::unique_ptr<Pending> pending_;
  std::vector<v1::ResizeInfo> resizes_;
  std::vector<v1::WorldInfo> decided_;  // the last few decided worlds, for repeated reports
  std::vector<v1::LostWorker> lost_;     // ascending epochs
};

}  // namespace trellis
