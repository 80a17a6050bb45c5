#include "operator/progress_status.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/base/eta.h"
#include "operator/job_status.h"

namespace trellis::op {
namespace {

// `v` rounded to 3 significant figures (samples/s, loss, skew): enough to read, and a figure
// that jitters in its 4th digit does not cause a status write.
double Round3(double v) {
  if (v == 0 || !std::isfinite(v)) return 0;
  const double scale = std::pow(10.0, 2 - std::floor(std::log10(std::fabs(v))));
  return std::round(v * scale) / scale;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// "62.2 ms", "0.47 ms": 3 significant digits.
std::string Ms(double seconds) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3g ms", seconds * 1000);
  return buf;
}

}  // namespace

Json ProgressJson(const v1::JobProgress& p) {
  Json j = Json::object();
  j["step"] = Json::number(p.step());
  if (p.total_steps() > 0) j["totalSteps"] = Json::number(p.total_steps());
  j["samplesPerSecond"] = Json::number(Round3(p.samples_per_second()));
  if (p.has_loss()) j["loss"] = Json::number(Round3(p.loss()));
  if (p.eta_seconds() >= 0) {
    // Whole seconds are enough, and an ETA that changes each poll would write each poll anyway.
    j["etaSeconds"] = Json::number(static_cast<int64_t>(std::llround(p.eta_seconds())));
    j["eta"] = JStr(FormatEta(p.eta_seconds()));
  }
  j["stepSeconds"] = Json::number(Round3(p.step_seconds()));
  if (p.slowest_rank() >= 0) {
    j["slowestRank"] = Json::number(p.slowest_rank());
    j["slowestPod"] = JStr(p.slowest_pod());
    j["skew"] = Json::number(Round3(p.skew()));
  }
  return j;
}

void FinishProgress(Json& status, bool succeeded, Clock::time_point now) {
  if (const Json* progress = At(status, {"progress"}); progress && progress->is_object()) {
    Json p = *progress;
    for (const char* running : {"eta", "etaSeconds", "samplesPerSecond"}) {
      if (p.has_field(running)) p.erase(running);
    }
    if (auto total = Int(p, {"totalSteps"}); succeeded && total && *total > 0) p["step"] = Json::number(*total);
    status["progress"] = p;
  }
  if (const Json* conds = At(status, {"conditions"}); conds && conds->is_array()) {
    bool straggler = false, stalled = false;
    for (size_t i = 0; i < conds->size(); ++i) {
      const bool on = Str(conds->at(i), {"status"}) == "True";
      straggler |= on && Str(conds->at(i), {"type"}) == kStragglerCondition;
      stalled |= on && Str(conds->at(i), {"type"}) == kStalledCondition;
    }
    if (straggler) SetCondition(status, kStragglerCondition, false, "JobFinished", "the job has ended", now);
    if (stalled) SetCondition(status, kStalledCondition, false, "JobFinished", "the job has ended", now);
  }
}

namespace {

Json CheckpointJson(const v1::CheckpointInfo& c) {
  Json j = Json::object();
  j["step"] = Json::number(c.step());
  j["path"] = JStr(c.path());
  j["time"] = JStr(FormatTime(Clock::time_point(std::chrono::milliseconds(c.unix_ms()))));
  return j;
}

}  // namespace

bool ApplyCheckpoint(Json& status, const v1::JobProgress& p) {
  if (p.has_checkpoint() && p.checkpoint().step() > 0) {
    Json c = CheckpointJson(p.checkpoint());
    c["onExit"] = Json::boolean(p.checkpoint().on_exit());
    status["checkpoint"] = c;
  }
  if (!p.has_resumed_from() || p.resumed_from().step() <= 0) return false;
  const Json r = CheckpointJson(p.resumed_from());
  const Json* old = At(status, {"resumedFrom"});
  if (old && Int(*old, {"step"}) == Int(r, {"step"}) && Str(*old, {"path"}) == Str(r, {"path"})) {
    return false;  // the same resume, heard again (the time is the scheduler's, of this report)
  }
  status["resumedFrom"] = r;
  return true;
}

std::string ResumedMessage(const std::string& job, const Json& resumed_from) {
  return "job " + job + " resumed from the checkpoint of step " +
         std::to_string(Int(resumed_from, {"step"}).value_or(0)) + " (" + Str(resumed_from, {"path"}) + ")";
}

bool ApplyLastProgress(Json& status, const v1::JobProgress& p, bool succeeded, Clock::time_point now) {
  if (p.reported()) status["progress"] = ProgressJson(p);
  const bool resumed = ApplyCheckpoint(status, p);
  FinishProgress(status, succeeded, now);
  return resumed;
}

bool ApplyStoppedFromOutside(Json& status, const v1::JobProgress& p, bool suspended, Clock::time_point now) {
  if (suspended || !p.stopping() || ConditionTrue(status, kStoppedFromOutsideCondition)) return false;
  SetCondition(status, kStoppedFromOutsideCondition, true, "PodsStopped",
               "the job's scheduler stops the job as a whole (" + Truncate(p.stop_reason(), 1024) +
                   "): it restarts as a whole, from the exit checkpoint",
               now);
  return true;
}

bool ApplyProgress(Json& status, const v1::JobProgress& p, Clock::time_point now) {
  const Json before = status;
  if (p.reported()) status["progress"] = ProgressJson(p);
  ApplyCheckpoint(status, p);
  bool had = false, had_stalled = false;
  if (const Json* conds = At(status, {"conditions"}); conds && conds->is_array()) {
    for (size_t i = 0; i < conds->size(); ++i) {
      had |= Str(conds->at(i), {"type"}) == kStragglerCondition;
      had_stalled |= Str(conds->at(i), {"type"}) == kStalledCondition;
    }
  }
  if (p.stalled_size() > 0) {
    std::string msg;
    for (const auto& line : p.stalled()) msg += (msg.empty() ? "" : "; ") + line;
    SetCondition(status, kStalledCondition, true, "ProgramStalled", msg, now);
  } else if (had_stalled) {
    SetCondition(status, kStalledCondition, false, "NoStall",
                 "every server and worker program reports progress", now);
  }
  const std::string rule = "factor " + Fixed(p.straggler_factor(), 2) + ", window " +
                           Fixed(p.straggler_window_seconds(), 0) + " s";
  if (p.straggler_rank() >= 0) {
    const auto& r = p.ranks(p.straggler_rank());
    const double med = p.straggler_rank() == p.slowest_rank() && p.skew() > 0
                           ? r.busy_seconds() / p.skew()
                           : 0;
    std::string msg = "worker rank " + std::to_string(p.straggler_rank()) + " (pod " +
                      p.straggler_pod() + ") computes " + Ms(r.busy_seconds()) + " per step";
    if (med > 0) msg += ", " + Fixed(p.skew(), 1) + "x the other workers' median " + Ms(med);
    msg += ", for " + Fixed(p.straggler_for_seconds(), 0) + " s (" + rule + ")";
    SetCondition(status, kStragglerCondition, true, "SlowWorker", msg, now);
  } else if (had) {
    SetCondition(status, kStragglerCondition, false, "NoStraggler",
                 "no worker is slower than the others' median by the " + rule, now);
  }
  return status != before;
}

std::vector<std::string> ApplyProgramRestarts(Json& status, const v1::ClusterView& view,
                                              ProgramRestartsSeen& known) {
  std::vector<std::string> events;
  int64_t added_total = 0;
  for (const v1::Role role : {v1::ROLE_SERVER, v1::ROLE_WORKER}) {
    const char* key = role == v1::ROLE_SERVER ? "server" : "worker";
    const auto& nodes = role == v1::ROLE_SERVER ? view.servers() : view.workers();
    const int64_t recorded = std::clamp<int64_t>(Int(status, {"replicaStatuses", key, "programRestarts"}).value_or(0), 0, 1 << 24);
    int64_t added = 0, total = 0;
    for (const auto& n : nodes) {
      const int32_t now = std::clamp<int32_t>(n.program_restarts(), 0, 1 << 24);
      total += now;
      auto it = known.find({role, n.rank()});
      const int32_t before = it != known.end() ? it->second : (recorded == 0 ? 0 : now);
      for (int32_t k = before + 1; k <= now && k <= before + 10; ++k) {  // a burst: the first ten
        events.push_back(std::string(key) + " " + std::to_string(n.rank()) + " (pod " + n.pod_name() +
                         "): its program was restarted inside the pod by its agent (restart " +
                         std::to_string(k) + " there; the program's last exit code " +
                         std::to_string(n.last_exit_code()) + ")");
      }
      if (now > before) added += now - before;
      known[{role, n.rank()}] = now;
    }
    const int64_t next = std::max(recorded + added, total);
    if (next == recorded) continue;
    const int64_t restarts = Int(status, {"replicaStatuses", key, "restarts"}).value_or(0);
    Put(status, {"replicaStatuses", key, "programRestarts"}, Json::number(next));
    Put(status, {"replicaStatuses", key, "restarts"}, Json::number(restarts + next - recorded));
    added_total += next - recorded;
  }
  if (added_total > 0) status["restarts"] = Json::number(Int(status, {"restarts"}).value_or(0) + added_total);
  return events;
}

}  // namespace trellis::op
