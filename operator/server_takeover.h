// Elastic servers on Kubernetes (docs/elastic.md#losing-a-server): a server pod that failed and
// whose agent said the scheduler had another server's pod take its rank over (its termination
// report's `taken-over`). The job goes on: the pod is neither the job's failure nor made again,
// and is kept for its logs (cleanPodPolicy decides at the end).
#pragma once

#include "common/job/job_spec.h"
#include "operator/observed_pod.h"

namespace trellis::op {

struct PlanRound;

bool TakenOverServer(const JobSpec& spec, const ObservedPod& p);

// Takeovers not noted yet: each goes into status.world.takenOver {server, pod, reason, time} with
// a ServerTakenOver Warning event naming the pod that runs it now.
void NoteTakenOverServers(PlanRound& r);

}  // namespace trellis::op
