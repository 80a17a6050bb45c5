#include "operator/exit_checkpoint.h"

#include <cstdio>

#include "operator/progress_status.h"

namespace trellis::op {
namespace {

// The condition of `type`, or nullptr.
const Json* Condition(const Json& status, const char* type) {
  const Json* conds = At(status, {"conditions"});
  if (!conds || !conds->is_array()) return nullptr;
  for (size_t i = 0; i < conds->size(); ++i) {
    if (Str(conds->at(i), {"type"}) == type) return &conds->at(i);
  }
  return nullptr;
}

std::string Secs(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

bool ExitCheckpointSettled(const Json& status) {
  const Json* stopping = Condition(status, kStoppingCondition);
  const Json* suspended = Condition(status, "Suspended");
  if (!stopping || Str(*stopping, {"status"}) != "False") return false;
  if (!suspended || Str(*suspended, {"status"}) != "True") return true;
  const auto settled = ParseTime(Str(*stopping, {"lastTransitionTime"}));
  const auto began = ParseTime(Str(*suspended, {"lastTransitionTime"}));
  return settled && began && *settled >= *began;
}

bool ExitCheckpointUnderWay(const Json& status) { return ConditionTrue(status, kStoppingCondition); }

ExitCheckpointStep StepExitCheckpoint(Json& status, const StatusOr<v1::JobProgress>& progress,
                                      bool workers_running, std::chrono::seconds grace, Clock::time_point now) {
  ExitCheckpointStep step;
  const Json* cond = Condition(status, kStoppingCondition);
  std::optional<Clock::time_point> began;
  if (cond && Str(*cond, {"status"}) == "True") began = ParseTime(Str(*cond, {"lastTransitionTime"}));
  if (!began) {
    SetCondition(status, kStoppingCondition, true, "ExitCheckpoint",
                 "suspended: the workers stop at a step boundary after rank 0's exit checkpoint; the pods are "
                 "deleted then (at most terminationGracePeriodSeconds, " + std::to_string(grace.count()) + " s)",
                 now);
    began = now;
  }
  if (progress.ok()) ApplyCheckpoint(status, *progress);
  const int64_t newest = Int(status, {"checkpoint", "step"}).value_or(0);
  const std::string newest_words =
      newest > 0 ? "the newest checkpoint is of step " + std::to_string(newest) + " (" + Str(status, {"checkpoint", "path"}) + ")"
                 : std::string("no checkpoint was written");
  auto settle = [&](const char* type, const char* reason, const std::string& message) {
    SetCondition(status, kStoppingCondition, false, reason, message, now);
    step.event = JobPlan::Event{type, reason, message};
  };
  const auto waited = now - *began;
  if (progress.ok() && progress->has_checkpoint() && progress->checkpoint().on_exit()) {
    settle("Normal", "ExitCheckpointWritten",
           "exit checkpoint of step " + std::to_string(progress->checkpoint().step()) + " written (" +
               progress->checkpoint().path() + ", " + Secs(waited) +
               " after the stop); the job resumes from it when it is resumed");
  } else if (progress.ok() && !progress->exit_ready()) {
    settle("Normal", "NoExitCheckpoint",
           "rank 0 writes no exit checkpoint (no trellis::Checkpointer, nor a trellis.torch TrainingState with a checkpoint file); " + newest_words);
  } else if (!workers_running) {
    settle("Normal", "NoExitCheckpoint", "no worker runs to write an exit checkpoint; " + newest_words);
  } else if (!progress.ok() && waited >= kSchedulerUnreachableWait && waited < grace) {
    settle("Warning", "SchedulerUnreachable",
           "the operator cannot reach the job's scheduler (" + progress.status().message() +
               "); the pods are deleted now: their agents ask the scheduler themselves and, when they reach "
               "it, the job still stops with rank 0's exit checkpoint; " + newest_words);
  } else if (waited >= grace) {
    settle("Warning", "NoExitCheckpoint",
           "no exit checkpoint within terminationGracePeriodSeconds (" + std::to_string(grace.count()) + " s)" +
               (progress.ok() ? std::string() : "; the scheduler did not answer: " + progress.status().message()) +
               "; " + newest_words);
  } else {
    step.hold_pods = true;
  }
  return step;
}

}  // namespace trellis::op
