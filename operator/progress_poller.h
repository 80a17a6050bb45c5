// Training progress into the TrainingJob (docs/kubernetes.md#progress): one thread ("progress")
// that, every `interval`, asks each Running job's scheduler for its JobProgress (GetProgress,
// with the job's token) and its cluster view (GetCluster), and writes status.progress, the
// Straggler condition and the programs' restarts inside their pods (with a ProgramRestarted
// Event each) when they changed -- at most one status write per job per interval, never one per
// step. A write that loses a race with the reconciler (409) waits for the next round.
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
#include "scheduler/scheduler_client.h"

namespace trellis::op {

struct ProgressPollerOptions {
  std::string watch_namespace;  // empty: every namespace
  std::chrono::milliseconds interval{std::chrono::seconds(5)};
  // A JSON file {"<namespace>/<service>:<port>": "host:port"} for clusters whose Services the
  // operator cannot reach by DNS (the test kubelet writes one); empty: "<service>.<ns>.svc:<port>".
  std::string scheduler_addresses_file;
};

class ProgressPoller {
 public:
  // `jobs` (optional): the Controller's cache of TrainingJobs; each round reads the jobs from it
  // (no LIST), and the status it writes goes into it. Without it each round LISTs the jobs.
  ProgressPoller(KubeClient& client, OperatorSettings settings, ProgressPollerOptions options,
                 ObjectStore* jobs = nullptr);
  ~ProgressPoller();  // Stop()s

  void Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  // One round over the Running jobs (the thread's body; tests call it by hand). Returns the
  // number of status writes.
  int PollOnce();

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, name
  struct Scheduler {
    std::string uid;       // of the job it belongs to (a recreated job gets a new token)
    std::string address;
    std::unique_ptr<SchedulerClient> client;
  };
  // Polls one job and writes its status when it changed; true when written.
  StatusOr<bool> PollJob(const Json& job);
  // `tls_secret` non-empty: the job runs mutual TLS (spec.tls.secretName); the client presents
  // that Secret's certificate and checks `server_name`.
  StatusOr<SchedulerClient*> ClientFor(const std::string& ns, const std::string& name,
                                       const std::string& uid, const std::string& tls_secret,
                                       const std::string& server_name);
  StatusOr<std::string> SchedulerAddress(const std::string& ns, const std::string& name) const;
  void Loop() EXCLUDES(mu_);

  KubeClient& client_;
  const OperatorSettings settings_;
  const ProgressPollerOptions options_;
  ObjectStore* const jobs_;  // may be null
  std::map<Key, Scheduler> schedulers_;  // poller thread only
  // Per job uid: the programs' restarts inside their pods seen so far (poller thread only).
  std::map<std::string, ProgramRestartsSeen> restarts_seen_;

  Mutex mu_;
  CondVar cv_;  // signalled by Stop()
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace trellis::op
