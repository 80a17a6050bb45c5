// Reconcile(job): read the world (the job, its pods), plan with PlanJob, write status through
// the status subresource, then create or delete the difference. Level-based and idempotent:
// running it twice, or in a freshly started operator, creates nothing twice (pod names are fixed
// and the API server answers AlreadyExists).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "common/base/status.h"
#include "operator/desired.h"
#include "operator/gang.h"
#include "operator/job_status.h"
#include "operator/kube_client.h"
#include "operator/object_cache.h"
#include "operator/observed_pod.h"
#include "operator/scheduler_clients.h"

namespace trellis::op {

// Hooks for metrics; all optional.
struct ReconcileObserver {
  // After each reconcile: the job ("namespace/name") and its phase now; "" once it is gone.
  std::function<void(const std::string& job, const std::string& phase)> on_phase;
};

class Reconciler {
 public:
  using Now = std::function<Clock::time_point()>;
  // `cache` (optional, owned by the caller, filled by the Controller's watches): reads come from
  // it and writes go into it, so a reconcile that finds nothing to change makes no API request.
  // Without it every reconcile reads the job, its pods and its objects from the API server.
  // `schedulers` (optional, outlives the reconciler): a suspended job with checkpoints keeps its
  // pods until rank 0's exit checkpoint is written (operator/exit_checkpoint.h); without it the
  // pods are deleted at once. A job that ends gets its scheduler's last progress through it.
  Reconciler(KubeClient& client, OperatorSettings settings, Now now, ReconcileObserver observer = {},
             ObjectCache* cache = nullptr, SchedulerCalls* schedulers = nullptr);

  // Returns when to look at the job again without an event (deadline, TTL); nullopt: on the
  // next event. Errors are API errors (the caller retries with back-off). A status write that
  // loses a race (409) is retried from a fresh read, a few times.
  //
  // Never throws, whatever the job holds: an exception out of the job's reconcile fails that
  // job (reason ReconcileError). An object built from the job that the API server refuses
  // (FailedCreate) is reported on the job: a Warning Event and a condition with the server's
  // message; phase Failed when the refusal is permanent (400/422), else the error is returned
  // and retried with back-off.
  StatusOr<std::optional<Clock::duration>> Reconcile(const std::string& ns, const std::string& name);

 private:
  // One attempt; ABORTED when the status write conflicted.
  StatusOr<std::optional<Clock::duration>> Attempt(const std::string& ns, const std::string& name);
  // Attempt, with any exception turned into FailJob.
  StatusOr<std::optional<Clock::duration>> Guarded(const std::string& ns, const std::string& name);
  // A suspended job with checkpoints whose pods still run: asks its scheduler for the exit
  // checkpoint and keeps the pods (clears plan->remove) until it is settled. Returns whether
  // it keeps them.
  bool AwaitExitCheckpoint(const Json& job, const JobSpec& spec, const std::vector<ObservedPod>& pods,
                           JobPlan* plan, Clock::time_point now);
  // An elastic job's resize (operator/elastic_resize.h): asks the scheduler for plan->resize,
  // follows one under way through its progress, and writes what came of it into plan->status.
  void FollowResize(const Json& job, JobPlan* plan, Clock::time_point now);
  // Creates what the plan asks for; the first refusal as an error naming the object. `*first`:
  // set when the job's objects were created now (its token Secret did not exist).
  Status CreateObjects(const JobMeta& meta, const JobSpec& spec, const JobPlan& plan, bool* first);
  Status EnsureSupport(const JobMeta& meta, const JobSpec& spec, bool* first);
  // Gang-scheduled jobs (operator/gang.h): the PodGroup exists before the pods while the job
  // may run; it is deleted while the job is suspended or over, so it holds no place in the gang
  // scheduler's queue. A PodGroup the server refuses is reported, not retried in a loop.
  StatusOr<GangObservation> EnsurePodGroup(const JobMeta& meta, const JobSpec& spec);
  Status RemovePodGroup(const JobMeta& meta, const JobSpec& spec);
  // Records a refused object on `job` (whose status is `status`): see Reconcile.
  StatusOr<std::optional<Clock::duration>> ReportRefusal(const Json& job, Json status, const Status& refusal);
  // Marks the job Failed with `reason` and `message` (a fresh read; no write when it already is).
  StatusOr<std::optional<Clock::duration>> FailJob(const std::string& ns, const std::string& name,
                                                   const std::string& reason, const std::string& message);
  // Writes `status` through the status subresource; returns the updated job.
  StatusOr<Json> WriteStatus(const Json& job, const Json& status);
  Status RecordEvent(const Json& job, const std::string& type, const std::string& reason,
                     const std::string& message);
  // Reads through the cache when it has the resource (NOT_FOUND when it holds no such object),
  // else from the API server.
  StatusOr<Json> Read(const Resource& r, ObjectStore* store, const std::string& ns, const std::string& name);
  StatusOr<std::vector<Json>> ReadPods(const std::string& ns, const std::string& job);
  // Creates `obj` unless the cache already holds it; the server's answer goes into the cache.
  Status Ensure(const Resource& r, ObjectStore* store, const std::string& ns, const Json& obj);
  // The job as the API server has it now, into the cache (after a write lost a race with a
  // change the cache had not seen yet).
  void Refresh(const std::string& ns, const std::string& name);
  // Drops deleted_pods_ entries older than a few minutes.
  void ForgetOldDeletes(Clock::time_point now);

  KubeClient& client_;
  OperatorSettings settings_;
  Now now_;
  ReconcileObserver observer_;
  ObjectCache* cache_;  // may be null
  SchedulerCalls* const schedulers_;  // may be null
  std::optional<std::string> phase_;  // of the last attempt, for the observer (reconcile thread only)
  // With a cache: the pods this reconciler deleted (uid -> when), until the cache shows them
  // going. A round soon after a delete must not judge such a pod again -- the pod watch can lag
  // the job's, and a failed pod seen twice counted twice toward backoffLimit (the Kubernetes
  // controllers' "expectations"). Reconcile thread only.
  std::map<std::string, Clock::time_point> deleted_pods_;
};

// Whether retrying the request that failed with `s` cannot help: the API server judged the
// object itself (400 BadRequest, 422 Invalid).
bool PermanentRefusal(const Status& s);

}  // namespace trellis::op
