// Training progress into the TrainingJob (docs/kubernetes.md#progress): one thread ("progress")
// that, every `interval`, asks each Running job's scheduler for its JobProgress (GetProgress,
// with the job's token) and its cluster view (GetCluster), and writes status.progress, the
// checkpoints (status.checkpoint; status.resumedFrom, with a Resumed Event), the Straggler
// condition, the programs' restarts inside their pods (with a ProgramRestarted Event each) and
// the workers an elastic job's scheduler lost for good (status.world.lost, a WorkerLost Event
// each; elastic_resize.h NoteLoss) when they changed -- at most one status write per job per
// interval, never one per step. A write that loses a race with the reconciler (409) waits for
// the next round.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/base/mutex.h"
#include "operator/desired.h"
#include "operator/kube_client.h"
#include "operator/object_cache.h"
#include "operator/progress_status.h"
#include "operator/scheduler_clients.h"

namespace trellis::op {

struct ProgressPollerOptions {
  std::string watch_namespace;  // empty: every namespace
  std::chrono::milliseconds interval{std::chrono::seconds(5)};
};

class ProgressPoller {
 public:
  // `jobs` (optional): the Controller's cache of TrainingJobs; each round reads the jobs from it
  // (no LIST), and the status it writes goes into it. Without it each round LISTs the jobs.
  // `schedulers` (shared with the reconciler) outlives the poller.
  ProgressPoller(KubeClient& client, SchedulerClients& schedulers, ProgressPollerOptions options,
                 ObjectStore* jobs = nullptr);
  ~ProgressPoller();  // Stop()s

  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  // One round over the Running jobs (the thread's body; tests call it by hand). Returns the
  // number of status writes.
  int PollOnce();

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, name
  // Polls one job and writes its status when it changed; true when written.
  StatusOr<bool> PollJob(const Json& job);
  void Loop() EXCLUDES(mu_);

  KubeClient& client_;
  SchedulerClients& schedulers_;
  const ProgressPollerOptions options_;
  ObjectStore* const jobs_;  // may be null
  // Per job uid: the programs' restarts inside their pods seen so far (poller thread only).
  std::map<std::string, ProgramRestartsSeen> restarts_seen_;

  Mutex mu_;
  CondVar cv_;  // signalled by Stop()
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trellis::op
