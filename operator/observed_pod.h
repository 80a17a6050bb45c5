// The observe step of the run policy: a pod of a job as the plan needs it (its role and rank,
// how far it got, how it ended), read from the Pod object the API server returned.
#pragma once

#include <optional>
#include <string>

#include "common/process/termination_report.h"
#include "operator/desired.h"
#include "operator/json_util.h"

namespace trellis::op {

struct ObservedPod {
  std::string name;
  std::string uid;  // metadata.uid: a pod made again under the same name has another
  PodRole role = PodRole::kWorker;
  int index = 0;
  std::string phase;   // Pending, Running, Succeeded, Failed, Unknown
  int exit_code = -1;  // of the terminated "trellis" container; -1 when unknown
  bool deleting = false;
  // The scheduler's message while it cannot place the pod (condition PodScheduled=False with
  // reason Unschedulable); empty otherwise.
  std::string unschedulable;
  std::string finished_at;  // that container's state.terminated.finishedAt (RFC 3339); empty: unknown
  // Why the pod was disrupted from outside, not by its program: "Evicted" (the kubelet's
  // node-pressure eviction), or the reason of a DisruptionTarget condition (eviction API,
  // preemption, taint manager). Empty: none.
  std::string disruption;
  // Of the terminated "trellis" container: the kubelet's reason (OOMKilled, Error, StartError,
  // ...) and its message (the agent's termination report, common/process/termination_report.h, or the
  // container runtime's words); empty: unknown.
  std::string terminated_reason;
  std::string terminated_message;
  TerminationReport report;  // parsed from terminated_message
  std::string memory_limit;  // that container's resources.limits.memory; empty: none
  // The "trellis" container cannot start (state.waiting with ErrImagePull, ImagePullBackOff,
  // InvalidImageName, CreateContainerConfigError, ...): "ImagePullBackOff: <the kubelet's
  // message>". Empty: none.
  std::string cannot_start;
  std::string cannot_start_reason;  // the kubelet's reason alone
};
// How a failed pod ended, for people: "was OOMKilled (memory limit 256Mi; exit code 137)",
// "failed: command not found: /app/train (exit code 127)", "failed with exit code 3"; the
// program's own last error follows when the report has one ("failed with exit code 1:
// ValueError: boom", at most 512 bytes of it).
std::string HowItFailed(const ObservedPod& p);
// nullopt for a pod without valid trellis.io/role and trellis.io/rank labels (not ours to judge).
std::optional<ObservedPod> ObservePod(const Json& pod);
// A condition reason naming how `p` failed (OOMKilled, CommandNotFound), else `fallback`.
std::string FailureReason(const ObservedPod& p, const std::string& fallback);
// The pod for people: "worker 3 (pod mlp-worker-3)", "scheduler (pod mlp-scheduler)".
std::string Describe(const ObservedPod& p);

}  // namespace trellis::op
