// Reconcile(job): read the world (the job, its pods), plan with PlanJob, write status through
// the status subresource, then create or delete the difference. Level-based and idempotent:
// running it twice, or in a freshly started operator, creates nothing twice (pod names are fixed
// and the API server answers AlreadyExists).
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "operator/desired.h"
#include "operator/gang.h"
#include "operator/kube_client.h"

namespace trellis::op {

// Hooks for metrics; all optional.
struct ReconcileObserver {
  // After each reconcile: the job ("namespace/name") and its phase now; "" once it is gone.
  std::function<void(const std::string& job, const std::string& phase)> on_phase;
};

class Reconciler {
 public:
  using Now = std::function<Clock::time_point()>;
  Reconciler(KubeClient& client, OperatorSettings settings, Now now, ReconcileObserver observer = {});

  // Returns when to look at the job again without an event (deadline, TTL); nullopt: on the
  // next event. Errors are API errors (the caller retries with back-off). A status write that
  // loses a race (409) is retried from a fresh read, a few times.
  StatusOr<std::optional<Clock::duration>> Reconcile(const std::string& ns, const std::string& name);

 private:
  // One attempt; ABORTED when the status write conflicted.
  StatusOr<std::optional<Clock::duration>> Attempt(const std::string& ns, const std::string& name);
  Status EnsureSupport(const JobMeta& meta, const JobSpec& spec);
  // Gang-scheduled jobs (operator/gang.h): the PodGroup exists before the pods while the job
  // may run; it is deleted while the job is suspended or over, so it holds no place in the gang
  // scheduler's queue. A PodGroup the server refuses is reported, not retried in a loop.
  StatusOr<GangObservation> EnsurePodGroup(const JobMeta& meta, const JobSpec& spec);
  Status RemovePodGroup(const JobMeta& meta, const JobSpec& spec);
  Status RecordEvent(const Json& job, const std::string& type, const std::string& reason,
                     const std::string& message);

  KubeClient& client_;
  OperatorSettings settings_;
  Now now_;
  ReconcileObserver observer_;
  std::optional<std::string> phase_;  // of the last attempt, for the observer (reconcile thread only)
};

// 32 random bytes from /dev/urandom as hex: the job token.
StatusOr<std::string> RandomToken();

}  // namespace trellis::op
