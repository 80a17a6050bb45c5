// A job stopped from outside (SIGTERM or Ctrl-C to trellis-launch) with checkpoints on: before
// any process is stopped, the scheduler is told (StopJob), rank 0 writes an exit checkpoint at
// its next step boundary and waits there, and the launcher waits for the scheduler to hear of
// that checkpoint -- at most the job's terminationGracePeriodSeconds; another signal ends the
// wait. Then StopAll stops the processes as for any signal
// (docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
#include <cstdio>

#include "common/process/subprocess.h"
#include "launcher/launcher.h"

namespace trellis {
namespace {

std::string Secs(std::chrono::steady_clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

}  // namespace

bool Launcher::AwaitExitCheckpoint(int signo) {
  if (job_.checkpoint.path.empty() || !client_) return false;
  const auto grace = std::chrono::seconds(job_.runPolicy.TerminationGraceSeconds());
  const auto start = std::chrono::steady_clock::now();
  console_.ClearStatus();
  console_.Line("trellis-launch: got " + SignalName(signo) +
                "; stopping the job at a step boundary after rank 0's exit checkpoint (at most " +
                std::to_string(grace.count()) + " s; another signal stops at once)");
  if (Status s = client_->StopJob("trellis-launch got " + SignalName(signo)); !s.ok()) {
    console_.Line("trellis-launch: cannot ask for an exit checkpoint: " + s.message());
    return false;
  }
  int64_t newest = 0;
  while (std::chrono::steady_clock::now() - start < grace) {
    PollAndPump(std::chrono::milliseconds(200), /*wake_on_exit=*/false);
    if (CheckSignal()) {
      console_.Line("trellis-launch: a second signal: stopping at once, without an exit checkpoint");
      return false;
    }
    auto p = client_->GetProgress();
    if (!p.ok()) continue;  // a scheduler being restarted answers again soon
    newest = p->checkpoint().step();
    if (p->checkpoint().on_exit()) {
      console_.Line("trellis-launch: exit checkpoint of step " + std::to_string(p->checkpoint().step()) +
                    " written (" + p->checkpoint().path() + ", " +
                    Secs(std::chrono::steady_clock::now() - start) +
                    " after the signal); run the job again to resume from it");
      return true;
    }
    if (!p->exit_ready()) {
      // Rank 0 never said it writes exit checkpoints (no Checkpointer; a trellis.torch program
      // before it named its file, or without a TrainingState): waiting would only delay the stop.
      console_.Line("trellis-launch: rank 0 writes no exit checkpoint (no trellis::Checkpointer, nor a trellis.torch TrainingState with a checkpoint file)" +
                    (newest > 0 ? "; the newest checkpoint is of step " + std::to_string(newest)
                                : std::string("; no checkpoint was written")));
      return false;
    }
    bool workers_running = false;
    for (auto& a : agents_) {
      if (a->plan.kind == ProcessPlan::Kind::kWorker && a->process && !a->exit && !a->process->Poll()) {
        workers_running = true;
      }
    }
    if (!workers_running) break;  // nothing left to write it
  }
  console_.Line("trellis-launch: no exit checkpoint within " + Secs(std::chrono::steady_clock::now() - start) +
                (newest > 0 ? "; the newest checkpoint is of step " + std::to_string(newest)
                            : std::string("; no checkpoint was written")));
  return false;
}

}  // namespace trellis
