#include "operator/elastic_resize.h"

#include <algorithm>

#include "operator/plan_phases.h"

namespace trellis::op {
namespace {

std::string Workers(int n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }
std::string Servers(int n) { return std::to_string(n) + (n == 1 ? " server" : " servers"); }
std::string Count(int n, bool servers) { return servers ? Servers(n) : Workers(n); }

std::vector<int> Dense(int n) {
  std::vector<int> out;
  for (int i = 0; i < n; ++i) out.push_back(i);
  return out;
}

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

void SetWorld(Json& st, const v1::WorldInfo& w) {
  Json world = Json::object();
  world["workers"] = Json::number(w.members_size());
  world["epoch"] = Json::number(static_cast<int64_t>(w.epoch()));
  world["fromStep"] = Json::number(static_cast<int64_t>(w.from_step()));
  Json members = Json::array();
  for (int i = 0; i < w.members_size(); ++i) members[i] = Json::number(w.members(i));
  world["members"] = members;
  // The run's servers (the world's, when it names them: a server resize) and a refused ask stay.
  for (const char* kept : {"servers", "serversAsked"}) {
    if (const Json* v = At(st, {"world", kept})) world[kept] = *v;
  }
  if (w.servers() > 0) world["servers"] = Json::number(w.servers());
  // The lost workers this world does not bring back stay listed.
  const std::vector<int> in(w.members().begin(), w.members().end());
  if (const Json* lost = At(st, {"world", "lost"}); lost && lost->is_array()) {
    Json keep = Json::array();
    size_t n = 0;
    for (const Json& e : lost->as_array()) {
      const auto slot = Int(e, {"worker"});
      if (slot && !Contains(in, static_cast<int>(*slot))) keep[n++] = e;
    }
    if (n > 0) world["lost"] = keep;
  }
  st["world"] = std::move(world);
}

void WriteLastResize(Json& st, const ResizeAsk& ask, const char* outcome, int64_t epoch, const std::string& message,
                     Clock::time_point now) {
  Json last = Json::object();
  last["from"] = Json::number(ask.from);
  last["to"] = Json::number(ask.to);
  last["reason"] = JStr(Truncate(ask.reason, 256));
  if (ask.servers) last["kind"] = JStr(kServersResize);
  last["outcome"] = JStr(outcome);
  last["requestTime"] = JStr(FormatTime(now));
  if (epoch > 0) last["epoch"] = Json::number(epoch);
  if (!message.empty()) last["message"] = JStr(Truncate(message, 1024));
  st["lastResize"] = std::move(last);
}

std::string Resize(const ResizeAsk& ask) {
  return "resize from " + Count(ask.from, ask.servers) + " to " + std::to_string(ask.to);
}

void Refuse(Json& st, const std::string& job, const ResizeAsk& ask, const std::string& why, Clock::time_point now,
            std::vector<JobPlan::Event>* events) {
  const std::string m = "job " + job + ": " + Resize(ask) + " refused: " + why + "; the job keeps running with " +
                        Count(ask.from, ask.servers);
  WriteLastResize(st, ask, kResizeRefused, 0, m, now);
  SetCondition(st, kResizingCondition, false, "ResizeRefused", m, now);
  events->push_back({"Warning", "ResizeRefused", m});
}

void Pending(Json& st, const std::string& job, const ResizeAsk& ask, int64_t epoch, Clock::time_point now,
             std::vector<JobPlan::Event>* events) {
  const std::string m = "job " + job + ": " + Resize(ask) + " (" + ask.reason + "); " +
                        (!ask.servers ? "the workers switch at a step boundary they agree on"
                         : ask.to > ask.from
                             ? "once the servers added are ready, the slices move at a step boundary the workers agree on"
                             : "the slices move at a step boundary the workers agree on");
  WriteLastResize(st, ask, kResizePending, epoch, "", now);
  SetCondition(st, kResizingCondition, true, "ResizeRequested", m, now);
  events->push_back({"Normal", "ResizeRequested", m});
}

// A Pending resize that will not take effect, saying why (`m`).
void Abandon(Json& st, const std::string& m, Clock::time_point now) {
  st["lastResize"]["outcome"] = JStr(kResizeAbandoned);
  st["lastResize"]["message"] = JStr(m);
  SetCondition(st, kResizingCondition, false, "ResizeAbandoned", m, now);
}

bool WithinBounds(const ElasticSpec& e, int64_t workers) {
  return workers >= e.minWorkers && workers <= e.maxWorkers;
}

}  // namespace

bool ServersResize(const Json& status) { return Str(status, {"lastResize", "kind"}) == kServersResize; }

std::vector<int> WorldMembers(const Json& status) {
  const auto workers = WorldWorkers(status);
  if (!workers) return {};
  std::vector<int> out;
  if (const Json* m = At(status, {"world", "members"}); m && m->is_array() && m->size() == static_cast<size_t>(*workers)) {
    for (const Json& e : m->as_array()) {
      if (!e.is_integer()) return Dense(*workers);
      const int64_t slot = e.as_number().to_int64();
      if (slot < 0 || slot >= kMaxReplicas || (!out.empty() && slot <= out.back())) return Dense(*workers);
      out.push_back(static_cast<int>(slot));
    }
    return out;
  }
  return Dense(*workers);  // written before the members were kept: the lowest slots
}

std::vector<int> WorkerSlots(const JobSpec& spec, const Json& job) {
  const Json* status = At(job, {"status"});
  std::vector<int> slots = status && spec.elastic.enabled && Str(*status, {"phase"}) != kSuspended
                               ? WorldMembers(*status)
                               : std::vector<int>{};
  if (slots.empty()) return Dense(spec.workers.replicas);
  // A grow under way brings in the lowest slots outside the world, as the scheduler picks them.
  for (int s = 0; static_cast<int>(slots.size()) < spec.workers.replicas && s < kMaxReplicas; ++s) {
    if (!Contains(slots, s)) slots.push_back(s);
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

bool LostWorker(const JobSpec& spec, const ObservedPod& p) {
  return spec.elastic.enabled && p.role == PodRole::kWorker && p.phase == "Failed" && !p.report.lost.empty();
}

std::string NoteLoss(Json& st, const std::string& job, int slot, const std::string& pod, const std::string& why,
                     bool silent, int64_t generation, Clock::time_point now) {
  const std::vector<int> members = WorldMembers(st);
  std::vector<int> lost = LostSlots(st);
  // Outside the world (resized away before), or noted in an earlier round.
  if (!Contains(members, slot) || Contains(lost, slot)) return "";
  Json entry = Json::object();
  entry["worker"] = Json::number(slot);
  entry["pod"] = JStr(pod);
  entry["reason"] = JStr(Truncate(why, 1024));
  entry["time"] = JStr(FormatTime(now));
  if (silent) entry["silent"] = Json::boolean(true);
  const Json* listed = At(st, {"world", "lost"});
  Json list = listed && listed->is_array() ? *listed : Json::array();
  list[list.size()] = entry;
  st["world"]["lost"] = list;
  lost.push_back(slot);
  int remain = 0;
  for (int m : members) remain += !Contains(lost, m);
  const std::string m = "job " + job + ": worker " + std::to_string(slot) + " (pod " + pod + ") is lost for good (" +
                        Truncate(why, 512) + "); the job goes on with " + Workers(remain) +
                        " (spec.elastic); no pod is made again for it";
  Json* last = At(st, {"lastResize"}) ? &st["lastResize"] : nullptr;
  if (last && Str(*last, {"outcome"}) == kResizePending) {
    // A resize under way: the scheduler leaves the lost one out of it, or made another (a
    // loss's): followed all the same, its new world is the scheduler's.
    if (Int(*last, {"lostWorker"})) (*last)["to"] = Json::number(remain);
    return m;
  }
  const ResizeAsk ask{static_cast<int>(members.size()), remain, "worker " + std::to_string(slot) + " lost"};
  WriteLastResize(st, ask, kResizePending, 0, "", now);
  st["lastResize"]["lostWorker"] = Json::number(slot);
  st["lastResize"]["generation"] = Json::number(generation);
  SetCondition(st, kResizingCondition, true, "WorkerLost", m, now);
  return m;
}

std::vector<int> LostSlots(const Json& st, bool silent_only) {
  std::vector<int> out;
  const Json* lost = At(st, {"world", "lost"});
  if (!lost || !lost->is_array()) return out;
  for (const Json& e : lost->as_array()) {
    if (silent_only && !Bool(e, {"silent"})) continue;
    if (const auto slot = Int(e, {"worker"}); slot && *slot >= 0 && *slot < kMaxReplicas) {
      out.push_back(static_cast<int>(*slot));
    }
  }
  return out;
}

std::string DeletedSilentPod(const Json& status, int slot) {
  const Json* lost = At(status, {"world", "lost"});
  if (!lost || !lost->is_array()) return "";
  for (const Json& e : lost->as_array()) {
    if (Int(e, {"worker"}) == slot && Bool(e, {"silent"})) return Str(e, {"deletedPodUid"});
  }
  return "";
}

void NoteSilentPodDeleted(Json& status, int slot, const std::string& uid) {
  const Json* lost = At(status, {"world", "lost"});
  if (!lost || !lost->is_array() || uid.empty()) return;
  Json list = *lost;
  for (size_t i = 0; i < list.size(); ++i) {
    if (Int(list[i], {"worker"}) == slot && Bool(list[i], {"silent"})) list[i]["deletedPodUid"] = JStr(uid);
  }
  status["world"]["lost"] = list;
}

bool LostSilently(const Json& status, int slot) { return Contains(LostSlots(status, /*silent_only=*/true), slot); }

void NoteLostWorkers(PlanRound& r) {
  if (!r.phase.empty() || !r.spec.elastic.enabled) return;
  for (const ObservedPod& p : r.pods) {
    if (!LostWorker(r.spec, p) || p.deleting) continue;
    const std::string m = NoteLoss(r.plan.status, r.name, p.index, p.name, p.report.lost, /*silent=*/false,
                                     r.generation, r.now);
    if (!m.empty()) r.plan.events.push_back({"Warning", "WorkerLost", m});
  }
}

std::optional<JobPlan::Event> NoteSchedulersGrow(Json& st, const std::string& job, const v1::JobProgress& p,
                                                Clock::time_point now) {
  if (!WorldWorkers(st) || Str(st, {"lastResize", "outcome"}) == kResizePending) return std::nullopt;
  const std::vector<int> world = WorldMembers(st);
  const int64_t known = Int(st, {"world", "epoch"}).value_or(0);
  const std::vector<int> lost = LostSlots(st);
  std::string back;  // "worker 1", the lost slots it brings back
  auto reason = [&](const std::vector<int>& members) {
    for (int m : members) {
      if (!Contains(world, m) && Contains(lost, m)) back += (back.empty() ? "worker " : ", ") + std::to_string(m);
    }
    return back.empty() ? std::string() : back + " came back after it was lost";
  };
  if (p.resize_pending_epoch() > known) {
    const std::vector<int> members(p.resize_pending_members().begin(), p.resize_pending_members().end());
    const std::string why = reason(members);
    if (why.empty()) return std::nullopt;  // not a grow back: the operator's own, or a loss noted apart
    const ResizeAsk ask{static_cast<int>(world.size()), static_cast<int>(members.size()), why};
    const std::string m = "job " + job + ": " + why + " (its pod's program asked to join); " + Resize(ask) +
                          ", at a step boundary the workers agree on";
    WriteLastResize(st, ask, kResizePending, p.resize_pending_epoch(), "", now);
    SetCondition(st, kResizingCondition, true, "WorkerBack", m, now);
    return JobPlan::Event{"Normal", "WorkerBack", m};
  }
  // Decided between two polls: the world it made.
  if (p.resize_pending_epoch() != 0 || p.world().epoch() <= known || !p.has_last_resize() ||
      p.last_resize().epoch() != p.world().epoch()) {
    return std::nullopt;
  }
  const std::vector<int> members(p.world().members().begin(), p.world().members().end());
  const std::string why = reason(members);
  if (why.empty()) return std::nullopt;
  const ResizeAsk ask{static_cast<int>(world.size()), static_cast<int>(members.size()), why};
  WriteLastResize(st, ask, kResizeDone, p.world().epoch(), "", now);
  st["lastResize"]["fromStep"] = Json::number(static_cast<int64_t>(p.world().from_step()));
  st["lastResize"]["doneTime"] = JStr(FormatTime(now));
  SetWorld(st, p.world());
  const std::string m = "job " + job + ": " + why + "; resized from " + Workers(ask.from) + " to " +
                        std::to_string(ask.to) + "; the new world trains from step " +
                        std::to_string(p.world().from_step());
  SetCondition(st, kResizingCondition, false, "Resized", m, now);
  return JobPlan::Event{"Normal", "Resized", m};
}

std::optional<int> WorldWorkers(const Json& status) {
  const auto w = Int(status, {"world", "workers"});
  if (!w || *w < 1 || *w > kMaxReplicas) return std::nullopt;
  return static_cast<int>(*w);
}

JobSpec WorldSpec(const JobSpec& spec, const Json& job) {
  const Json* status = At(job, {"status"});
  const auto world = status ? WorldWorkers(*status) : std::nullopt;
  if (!world) return spec;
  // While suspended, the replicas asked for are the next run's world (for an elastic job only
  // within spec.elastic; outside, ParseAtWorldReplicas gave `spec` the world's already).
  if (Str(*status, {"phase"}) == kSuspended &&
      (!spec.elastic.enabled || WithinBounds(spec.elastic, spec.workers.replicas))) {
    return spec;
  }
  JobSpec out = spec;
  out.workers.replicas = *world;
  // The run keeps the servers of its world; a server resize changes them (PlanResize).
  const auto servers = Int(*status, {"world", "servers"});
  if (servers && *servers >= 1 && *servers <= kMaxReplicas) out.servers.replicas = static_cast<int32_t>(*servers);
  // A grow under way: the joiners' pods are created now; they join at the step the members
  // agree on (docs/elastic.md#growing). A server grow's added servers likewise: the workers
  // hear of it once they are ready (docs/elastic.md#servers).
  const auto to = Int(*status, {"lastResize", "to"});
  const bool pending = Str(*status, {"lastResize", "outcome"}) == kResizePending && to && *to <= kMaxReplicas;
  if (pending && !ServersResize(*status) && *to > *world) out.workers.replicas = static_cast<int32_t>(*to);
  if (pending && ServersResize(*status) && *to > out.servers.replicas) out.servers.replicas = static_cast<int32_t>(*to);
  return out;
}

StatusOr<JobSpec> ParseAtWorldReplicas(const Json& job, const Status& error) {
  const Json* status = At(job, {"status"});
  const auto world = status ? WorldWorkers(*status) : std::nullopt;
  if (!world || !At(job, {"spec", "elastic"})) return error;
  Json copy = job;
  Put(copy, {"spec", "workers", "replicas"}, Json::number(*world));
  // Likewise spec.servers.replicas outside minServers, maxServers.
  if (const auto servers = Int(*status, {"world", "servers"}); servers && *servers >= 1 && *servers <= kMaxReplicas) {
    Put(copy, {"spec", "servers", "replicas"}, Json::number(*servers));
  }
  StatusOr<JobSpec> spec = ParseJobSpec(copy.serialize());
  if (!spec.ok() || !spec->elastic.enabled) return error;
  return spec;
}

// A changed spec.servers.replicas: an elastic job with minServers or maxServers set
// (`servers_elastic`) resizes its servers within them (docs/elastic.md#servers); any other count
// is refused on the job (a server the job's scheduler has no rank for, or one holding shards it
// would not hand over). A refusal is said once per count asked (a Warning event and the Resizing
// condition); the run keeps its servers (WorldSpec) and, without spec.elastic's server bounds,
// the count applies when the job next starts. Returns whether `asked` may be asked of the
// scheduler.
bool ServersAskable(PlanRound& r, int asked, bool servers_elastic) {
  Json& st = r.plan.status;
  const auto servers = Int(st, {"world", "servers"});
  const ElasticSpec& e = r.spec.elastic;
  const bool within = e.enabled && servers_elastic && asked >= e.minServers && asked <= e.maxServers;
  if (!servers || asked == *servers || within) {
    if (st.has_field("world") && At(st, {"world", "serversAsked"})) st["world"].erase("serversAsked");
    return servers && asked != *servers;
  }
  if (Int(st, {"world", "serversAsked"}) == asked) return false;
  st["world"]["serversAsked"] = Json::number(asked);
  const std::string why =
      e.enabled && servers_elastic
          ? "outside spec.elastic [" + std::to_string(e.minServers) + ", " + std::to_string(e.maxServers) +
                "] (minServers, maxServers); it keeps running with " + Servers(static_cast<int>(*servers))
          : "but a running job's parameter servers are resized only within spec.elastic.minServers and maxServers, "
            "which it does not set; it keeps running with " +
                Servers(static_cast<int>(*servers)) + ", and the new count applies when it next starts " +
                "(suspend and resume it: spec.runPolicy.suspend)" +
                (r.spec.serverMode == ServerMode::kUpdate
                     ? std::string("; in serverMode update its checkpoints hold the servers' shards, which "
                                   "another count cannot restore")
                     : std::string());
  const std::string m = "job " + r.name + ": spec.servers.replicas is " + std::to_string(asked) + ", " + why +
                        ", see docs/elastic.md";
  SetCondition(st, kResizingCondition, false, "ServersNotResized", m, r.now);
  r.plan.events.push_back({"Warning", "ResizeRefused", m});
  return false;
}

void PlanResize(PlanRound& r, int asked, int asked_servers, bool servers_elastic) {
  const JobSpec& spec = r.spec;  // the world's (WorldSpec)
  Json& st = r.plan.status;
  // The job's first pods, or those of a resumed run, are created from this spec: that is the
  // world (a new scheduler starts at epoch 0).
  if (!WorldWorkers(st) || r.old_phase == kSuspended) {
    if (st.has_field("world")) st.erase("world");  // a new run: nobody is lost in it
    SetWorld(st, [&] {
      v1::WorldInfo w;
      for (int i = 0; i < spec.workers.replicas; ++i) w.add_members(i);
      return w;
    }());
    st["world"]["servers"] = Json::number(spec.servers.replicas);
  }
  const bool servers_askable = ServersAskable(r, asked_servers, servers_elastic);
  const Json* last = At(st, {"lastResize"});
  const std::string outcome = last ? Str(*last, {"outcome"}) : "";
  if (outcome == kResizePending) {
    r.plan.follow_resize = true;
    return;
  }
  const int world = static_cast<int>(WorldMembers(st).size());
  // One kind at a time: the workers first, then the servers.
  if (asked == world && servers_askable && r.phase == kRunning) {
    const int from = static_cast<int>(Int(st, {"world", "servers"}).value_or(asked_servers));
    if (last && ServersResize(st) && Int(*last, {"to"}) == asked_servers && Int(*last, {"from"}) == from &&
        (outcome == kResizeRefused || outcome == kResizeAbandoned)) {
      return;  // said already, and nothing changed since
    }
    r.plan.resize = ResizeAsk{from, asked_servers, "spec.servers.replicas is " + std::to_string(asked_servers), true};
    return;
  }
  if (asked == world) return;
  // A worker lost for good is not made again (its pod failed as the job's policy says it stays
  // failed): the world the loss left runs on until the spec changes (a new generation).
  if (last && Int(*last, {"lostWorker"}) && Int(*last, {"generation"}) == r.generation) return;
  // An elastic job is asked to resize once it runs; any other job's size is fixed while its
  // pods exist (its scheduler cannot take or lose workers): refused until it is next started.
  if (spec.elastic.enabled && r.phase != kRunning) return;
  // Said already, and nothing changed since: not asked (nor an Event recorded) again each round.
  if (last && !ServersResize(st) && Int(*last, {"to"}) == asked && Int(*last, {"from"}) == world &&
      (outcome == kResizeRefused || outcome == kResizeAbandoned)) {
    return;
  }
  const ResizeAsk ask{world, asked, "spec.workers.replicas is " + std::to_string(asked)};
  if (!spec.elastic.enabled) {
    Refuse(st, r.name, ask,
           "the job has no spec.elastic, so its size is fixed while it runs; the new replicas apply when it next "
           "starts (suspend and resume it: spec.runPolicy.suspend), see docs/elastic.md",
           r.now, &r.plan.events);
    return;
  }
  if (!WithinBounds(spec.elastic, asked)) {
    Refuse(st, r.name, ask,
           "outside spec.elastic [" + std::to_string(spec.elastic.minWorkers) + ", " +
               std::to_string(spec.elastic.maxWorkers) + "]",
           r.now, &r.plan.events);
    return;
  }
  r.plan.resize = ask;
}

void EndResize(Json& st, const std::string& job, const std::string& why, Clock::time_point now) {
  if (Str(st, {"lastResize", "outcome"}) != kResizePending) return;
  Abandon(st, "job " + job + ": " + why + " before the resize took effect", now);
}

bool ApplyResizeAnswer(Json& st, const std::string& job, const ResizeAsk& ask,
                       const StatusOr<v1::ResizeResponse>& answer, int64_t pending_epoch, Clock::time_point now,
                       std::vector<JobPlan::Event>* events) {
  if (answer.ok()) {
    if (answer->epoch() <= answer->current().epoch()) {
      SetWorld(st, answer->current());  // the scheduler runs with that many already
      return true;
    }
    Pending(st, job, ask, answer->epoch(), now, events);
    return true;
  }
  switch (answer.status().code()) {
    case StatusCode::kFailedPrecondition:
      // One under way already (an operator restarted while it was): follow that one.
      if (pending_epoch > 0) {
        Pending(st, job, ask, pending_epoch, now, events);
        return true;
      }
      [[fallthrough]];
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnimplemented:
      Refuse(st, job, ask, "the job's scheduler says: " + answer.status().message(), now, events);
      return true;
    default:
      return false;  // not reached, or not now: asked again on a later round
  }
}

bool ApplyResizeProgress(Json& st, const std::string& job, const v1::JobProgress& p, Clock::time_point now,
                         std::vector<JobPlan::Event>* events) {
  if (!At(st, {"lastResize"})) return false;
  Json& last = st["lastResize"];
  int64_t epoch = Int(last, {"epoch"}).value_or(0);
  if (epoch == 0 && p.resize_pending_epoch() > 0) {
    epoch = p.resize_pending_epoch();
    last["epoch"] = Json::number(epoch);
  }
  const bool servers = ServersResize(st);
  const std::string from = Count(static_cast<int>(Int(last, {"from"}).value_or(0)), servers);
  // A loss the scheduler made a world without before the operator saw its epoch.
  const auto lost = Int(last, {"lostWorker"});
  const bool lost_gone = lost && p.resize_pending_epoch() == 0 &&
                         std::find(p.world().members().begin(), p.world().members().end(), *lost) ==
                             p.world().members().end();
  if ((epoch > 0 && p.world().epoch() >= epoch) || lost_gone) {
    SetWorld(st, p.world());
    last["outcome"] = JStr(kResizeDone);
    last["fromStep"] = Json::number(static_cast<int64_t>(p.world().from_step()));
    last["doneTime"] = JStr(FormatTime(now));
    const int to = servers ? p.world().servers() : p.world().members_size();
    const std::string m = "job " + job + ": resized from " + from + " to " + std::to_string(to) +
                          "; the new world trains from step " + std::to_string(p.world().from_step());
    SetCondition(st, kResizingCondition, false, "Resized", m, now);
    events->push_back({"Normal", "Resized", m});
    return false;
  }
  if (p.resize_pending_epoch() > 0) return true;
  const std::string m =
      "job " + job + ": the resize from " + from + " to " + std::to_string(Int(last, {"to"}).value_or(0)) +
      " was given up by the job's scheduler (" +
      (servers ? "a server added did not become ready in time, no worker reached a step boundary in time, or the "
                 "scheduler restarted); the job runs on with " +
                     Servers(static_cast<int>(Int(st, {"world", "servers"}).value_or(0))) +
                     "; change spec.servers.replicas to ask again"
               : "no worker reached a step boundary in time, or the scheduler restarted); the job runs on with " +
                     Workers(WorldWorkers(st).value_or(0)) + "; change spec.workers.replicas to ask again");
  Abandon(st, m, now);
  events->push_back({"Warning", "ResizeAbandoned", m});
  return false;
}

}  // namespace trellis::op
