#include "operator/elastic_resize.h"

#include "operator/plan_phases.h"

namespace trellis::op {
namespace {

std::string Workers(int n) { return std::to_string(n) + (n == 1 ? " worker" : " workers"); }

void SetWorld(Json& st, const v1::WorldInfo& w) {
  Json world = Json::object();
  world["workers"] = Json::number(w.members_size());
  world["epoch"] = Json::number(static_cast<int64_t>(w.epoch()));
  world["fromStep"] = Json::number(static_cast<int64_t>(w.from_step()));
  st["world"] = std::move(world);
}

void WriteLastResize(Json& st, const ResizeAsk& ask, const char* outcome, int64_t epoch, const std::string& message,
                     Clock::time_point now) {
  Json last = Json::object();
  last["from"] = Json::number(ask.from);
  last["to"] = Json::number(ask.to);
  last["reason"] = JStr(Truncate(ask.reason, 256));
  last["outcome"] = JStr(outcome);
  last["requestTime"] = JStr(FormatTime(now));
  if (epoch > 0) last["epoch"] = Json::number(epoch);
  if (!message.empty()) last["message"] = JStr(Truncate(message, 1024));
  st["lastResize"] = std::move(last);
}

std::string Resize(const ResizeAsk& ask) {
  return "resize from " + Workers(ask.from) + " to " + std::to_string(ask.to);
}

void Refuse(Json& st, const std::string& job, const ResizeAsk& ask, const std::string& why, Clock::time_point now,
            std::vector<JobPlan::Event>* events) {
  const std::string m = "job " + job + ": " + Resize(ask) + " refused: " + why + "; the job keeps running with " +
                        Workers(ask.from);
  WriteLastResize(st, ask, kResizeRefused, 0, m, now);
  SetCondition(st, kResizingCondition, false, "ResizeRefused", m, now);
  events->push_back({"Warning", "ResizeRefused", m});
}

void Pending(Json& st, const std::string& job, const ResizeAsk& ask, int64_t epoch, Clock::time_point now,
             std::vector<JobPlan::Event>* events) {
  const std::string m = "job " + job + ": " + Resize(ask) + " (" + ask.reason +
                        "); the workers switch at a step boundary they agree on";
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
  // A grow under way: the joiners' pods are created now; they join at the step the members
  // agree on (docs/elastic.md#growing).
  const auto to = Int(*status, {"lastResize", "to"});
  if (Str(*status, {"lastResize", "outcome"}) == kResizePending && to && *to > *world && *to <= kMaxReplicas) {
    out.workers.replicas = static_cast<int32_t>(*to);
  }
  return out;
}

StatusOr<JobSpec> ParseAtWorldReplicas(const Json& job, const Status& error) {
  const Json* status = At(job, {"status"});
  const auto world = status ? WorldWorkers(*status) : std::nullopt;
  if (!world || !At(job, {"spec", "elastic"})) return error;
  Json copy = job;
  Put(copy, {"spec", "workers", "replicas"}, Json::number(*world));
  StatusOr<JobSpec> spec = ParseJobSpec(copy.serialize());
  if (!spec.ok() || !spec->elastic.enabled) return error;
  return spec;
}

void PlanResize(PlanRound& r, int asked) {
  const JobSpec& spec = r.spec;  // the world's (WorldSpec)
  Json& st = r.plan.status;
  // The job's first pods, or those of a resumed run, are created from this spec: that is the
  // world (a new scheduler starts at epoch 0).
  if (!WorldWorkers(st) || r.old_phase == kSuspended) {
    SetWorld(st, [&] {
      v1::WorldInfo w;
      for (int i = 0; i < spec.workers.replicas; ++i) w.add_members(i);
      return w;
    }());
  }
  const Json* last = At(st, {"lastResize"});
  const std::string outcome = last ? Str(*last, {"outcome"}) : "";
  if (outcome == kResizePending) {
    r.plan.follow_resize = true;
    return;
  }
  const int world = spec.workers.replicas;
  if (asked == world) return;
  // An elastic job is asked to resize once it runs; any other job's size is fixed while its
  // pods exist (its scheduler cannot take or lose workers): refused until it is next started.
  if (spec.elastic.enabled && r.phase != kRunning) return;
  // Said already, and nothing changed since: not asked (nor an Event recorded) again each round.
  if (last && Int(*last, {"to"}) == asked && Int(*last, {"from"}) == world &&
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
  const std::string from = Workers(static_cast<int>(Int(last, {"from"}).value_or(0)));
  if (epoch > 0 && p.world().epoch() >= epoch) {
    SetWorld(st, p.world());
    last["outcome"] = JStr(kResizeDone);
    last["fromStep"] = Json::number(static_cast<int64_t>(p.world().from_step()));
    last["doneTime"] = JStr(FormatTime(now));
    const std::string m = "job " + job + ": resized from " + from + " to " + std::to_string(p.world().members_size()) +
                          "; the new world trains from step " + std::to_string(p.world().from_step());
    SetCondition(st, kResizingCondition, false, "Resized", m, now);
    events->push_back({"Normal", "Resized", m});
    return false;
  }
  if (p.resize_pending_epoch() > 0) return true;
  const std::string m = "job " + job + ": the resize from " + from + " to " +
                        std::to_string(Int(last, {"to"}).value_or(0)) +
                        " was given up by the job's scheduler (no worker reached a step boundary in time, or the "
                        "scheduler restarted); the job runs on with " +
                        Workers(WorldWorkers(st).value_or(0)) + "; change spec.workers.replicas to ask again";
  Abandon(st, m, now);
  events->push_back({"Warning", "ResizeAbandoned", m});
  return false;
}

}  // namespace trellis::op
