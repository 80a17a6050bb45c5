// trellis-launch: runs a whole TrainingJob on this machine (scheduler + one agent per server and
// worker, all on loopback), shows progress, passes worker output through, and stops every
// process it started on success, failure, deadline or signal.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "common/job/job_spec.h"
#include "common/process/subprocess.h"
#include "launcher/plan.h"
#include "launcher/progress.h"
#include "scheduler/scheduler_client.h"

namespace trellis {

class Launcher {
 public:
  // REQUIRES: SIGINT and SIGTERM are blocked in every thread (main() does it first), so
  // `signal_fd` (a signalfd for them) sees them.
  Launcher(LaunchOptions options, JobSpec job, int signal_fd, Console& console);
  ~Launcher();

  // Runs the job; returns the launcher's exit code (0, 1, 130, 143). Call from the main thread.
  int Run();

 private:
  struct Child {
    ProcessPlan plan;
    std::unique_ptr<Subprocess> process;
    std::optional<ExitStatus> exit;
    LineSplitter splitter;
    int log_fd = -1;           // workers: their log, where passed-through stdout is copied too
    bool pipe_open = false;
    int64_t grow_epoch = 0;  // elastic jobs: the grow it was started again for (once per grow)
    bool lost = false;       // elastic jobs: exited failing, and the job goes on without it
  };

  Status Prepare();                       // run dir, token file, TLS files
  Status PrepareTls();                    // paths_.tls and tls_ from spec.tls / --tls
  Status StartScheduler();                // and wait for its port file (a restart: same port)
  // The scheduler died: start it again on its port, at most backoffLimit times; the job's
  // members hand its state back (docs/scheduler.md#scheduler-restart). -1: restarted, else the
  // launcher's exit code.
  int RestartScheduler();
  // Connects to the scheduler just started, starts the cluster-watch thread and the agents.
  Status StartRun();
  Status StartAgents();
  Status Spawn(Child& c);  // starts (or starts again) the agent `c` plans
  // The Prometheus file-SD targets: the scheduler and every agent started so far.
  Status WriteMetricsTargets();
  // Elastic jobs: starts again the worker agents that left the world and that a grow under way
  // (the latest progress) brings back.
  Status StartJoiners() EXCLUDES(mu_);
  // Agents failed. Under runPolicy.failurePolicy RestartJob, when the job's scheduler failed the
  // job (in-job recovery cannot heal it), every process is stopped and started again, resuming
  // from the newest checkpoint, at most backoffLimit times (-1: restarted); else FailAgent.
  int RestartJobOrFail(const std::vector<Child*>& failed);
  int Supervise();                        // the event loop
  void PumpOutput(Child& c, bool drain);  // worker stdout -> console + log
  // Waits up to `wait` for a signal, agent output (pumped) or, with `wake_on_exit`, an agent's exit.
  void PollAndPump(std::chrono::milliseconds wait, bool wake_on_exit);
  void StopAll() EXCLUDES(mu_);           // agents first, then the scheduler
  int Fail(const std::string& message, const Child* culprit);
  int FailAgent(const std::vector<Child*>& failed) EXCLUDES(mu_);  // the job failed because agents did
  void WatchCluster() EXCLUDES(mu_);      // the cluster-watch thread
  std::optional<int> CheckSignal();       // 130/143 once SIGINT/SIGTERM arrived
  // After SIGINT/SIGTERM, with checkpoints on: asks for an exit checkpoint and waits for it, at
  // most terminationGracePeriodSeconds (exit_checkpoint.cc). True when it was written.
  bool AwaitExitCheckpoint(int signo);
  std::chrono::milliseconds Elapsed() const;
  std::string Progress() EXCLUDES(mu_);
  // Elastic jobs: why a worker agent exited 0 when not because training ended: its rank was
  // resized away (the scheduler's current world leaves it out), or the grow it was started for
  // was given up before it joined. Empty: it finished.
  std::string OutOfTheWorld(const Child& agent);
  // Elastic jobs: why the scheduler goes on without the worker agent that exited failing (empty:
  // it does not; the job fails or restarts). docs/elastic.md#losing-a-worker.
  // A server agent outside the job's world (the view's servers in force end below its rank):
  // its server was removed by a resize (it exited 0), or a grow started it and it failed before
  // it was ready (the scheduler gives the grow up). Its end is not the job's.
  bool ServerOutsideWorld(const Child& agent);
  // Elastic servers: the server this agent ran was lost for good and another server's pod took
  // it over (docs/elastic.md#losing-a-server): that server's name ("server-0"), else "". Its end
  // is not the job's.
  std::string TakenOver(const Child& agent);
  std::string LostWorker(const Child& agent);
  // Elastic jobs: the scheduler lost this worker while its agent was silent (a frozen process,
  // docs/elastic.md#losing-a-worker); the scheduler's why, from the watched view, else "".
  std::string LostWhileSilent(const Child& agent) EXCLUDES(mu_);
  std::string Training() EXCLUDES(mu_);  // FormatTraining of the latest progress

  const LaunchOptions options_;
  const JobSpec job_;
  const int signal_fd_;
  Console& console_;
  LaunchPaths paths_;
  TlsPtr tls_;  // loaded from paths_.tls: the launcher's own calls to the scheduler
  bool created_run_dir_ = false;
  // /metrics ports picked in Prepare (empty: --no-metrics) and the file-SD file written once
  // every process is planned, removed by StopAll.
  int scheduler_metrics_port_ = -1;
  std::vector<int> metrics_ports_;
  std::string metrics_targets_file_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();

  std::unique_ptr<Child> scheduler_;
  int scheduler_restarts_ = 0;
  int job_restarts_ = 0;  // whole-job restarts (runPolicy.failurePolicy RestartJob)
  std::vector<std::unique_ptr<Child>> agents_;
  std::unique_ptr<SchedulerClient> client_;

  Mutex mu_;
  CondVar cv_;  // signalled by StopAll()
  std::optional<v1::ClusterView> view_ GUARDED_BY(mu_);  // the latest cluster view
  v1::JobProgress training_ GUARDED_BY(mu_);              // the latest GetProgress answer
  bool stop_watch_ GUARDED_BY(mu_) = false;
  std::thread watch_thread_;
};

}  // namespace trellis
