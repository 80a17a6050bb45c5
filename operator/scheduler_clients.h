// The operator's gRPC clients to its jobs' schedulers: one per job, made from the job's token
// Secret (and, for a TLS job, its certificate Secret), kept while it works. The progress poller
// asks them for progress; the reconciler asks a suspended job's scheduler to stop it at a step
// boundary first (StopJob, docs/checkpoints.md#stopping-a-job-the-exit-checkpoint).
#pragma once

#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "operator/desired.h"
#include "operator/json_util.h"
#include "operator/kube_client.h"
#include "trellis/v1/scheduler.pb.h"
#include "scheduler/scheduler_client.h"

namespace trellis::op {

// What the reconciler asks of a job's scheduler (a seam for tests: it needs only this).
class SchedulerCalls {
 public:
  virtual ~SchedulerCalls() = default;
  // Asks `job`'s scheduler to stop the job at a step boundary (StopJob with `reason`;
  // idempotent), then returns its progress: whether rank 0 writes an exit checkpoint
  // (exit_ready) and whether it has (checkpoint.on_exit).
  virtual StatusOr<v1::JobProgress> StopJob(const Json& job, const std::string& reason) = 0;
  // `job`'s progress as its scheduler has it now: the last word on a job that has just ended,
  // whose end may come between two of the progress poller's rounds.
  virtual StatusOr<v1::JobProgress> Progress(const Json& job) = 0;
  // Asks `job`'s scheduler to resize its workers to `workers`, or (`workers` 0) its servers to
  // `servers` (an elastic job; operator/elastic_resize.h); the scheduler's answer, or why it
  // could not be asked.
  virtual StatusOr<v1::ResizeResponse> Resize(const Json& job, int workers, const std::string& reason,
                                              int servers) = 0;
};

class SchedulerClients : public SchedulerCalls {
 public:
  // `addresses_file`: a JSON file {"<namespace>/<service>:<port>": "host:port"} for clusters
  // whose Services the operator cannot reach by DNS (the test kubelet writes one); empty:
  // "<service>.<ns>.svc:<port>".
  SchedulerClients(KubeClient& client, OperatorSettings settings, std::string addresses_file);

  // The client for `job` (a TrainingJob object): the kept one while the job's uid and its
  // scheduler's address are unchanged, else a new one. Errors: its Secret cannot be read or
  // holds no token, a bad certificate, no address.
  StatusOr<std::shared_ptr<SchedulerClient>> For(const Json& job) EXCLUDES(mu_);
  // Drops the client of ns/name (a call failed: a restarted scheduler, a new token).
  void Forget(const std::string& ns, const std::string& name) EXCLUDES(mu_);
  // Drops every client but those of `keep` (namespace, name).
  void KeepOnly(const std::set<std::pair<std::string, std::string>>& keep) EXCLUDES(mu_);

  StatusOr<v1::JobProgress> StopJob(const Json& job, const std::string& reason) override;
  StatusOr<v1::JobProgress> Progress(const Json& job) override;
  StatusOr<v1::ResizeResponse> Resize(const Json& job, int workers, const std::string& reason,
                                      int servers) override;

 private:
  struct Kept {
    std::string uid;  // of the job it belongs to (a recreated job gets a new token)
    std::string address;
    std::shared_ptr<SchedulerClient> client;
  };
  StatusOr<std::string> Address(const std::string& ns, const std::string& name) const;
  StatusOr<std::shared_ptr<SchedulerClient>> Connect(const std::string& ns, const std::string& name,
                                                     const std::string& address, const Json& job);

  KubeClient& client_;
  const OperatorSettings settings_;
  const std::string addresses_file_;
  Mutex mu_;
  std::map<std::pair<std::string, std::string>, Kept> kept_ GUARDED_BY(mu_);
};

}  // namespace trellis::op
