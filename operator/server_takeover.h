// Elastic servers on Kubernetes (docs/elastic.md#losing-a-server): a parameter server lost for
// good whose rank another server's pod took over. Its pod is neither the job's failure nor made
// again (a failed one is kept for its logs; cleanPodPolicy decides at the end).
#pragma once

#include <string>

#include "common/job/job_spec.h"
#include "operator/json_util.h"
#include "operator/desired.h"
#include "operator/observed_pod.h"

namespace trellis::op {

struct PlanRound;


// The job's servers are elastic: spec.elastic with minServers < maxServers.
bool ServersElastic(const JobSpec& spec);

// A server pod that failed and whose agent said another server's pod took its rank over (its
// termination report's `taken-over`).
bool TakenOverServer(const JobSpec& spec, const ObservedPod& p);

// Server `d` of a job with elastic servers whose rank another pod runs now, or is about to:
// status.world.takenOver names its rank (the scheduler's view, noted by the progress poller or
// from its failed pod), its pod failed saying so, or its pod was deleted or evicted under
// restartPolicy Never while the job ran (its agent told the scheduler, which takes the rank over,
// or fails the job when no server is left to).
bool ServerTakenOver(const PlanRound& r, const DesiredPod& d);

// Server `rank` (its pod `pod`) taken over, into `st` (a job's status) as status.world.takenOver
// {server, pod, reason, time}. Returns the ServerTakenOver event's message; "" when noted already.
std::string NoteTakeOver(Json& st, const std::string& job, int rank, const std::string& pod, const std::string& why,
                         Clock::time_point now);

// The failed pods that say so, not noted yet: NoteTakeOver each, with a ServerTakenOver Warning event.
void NoteTakenOverServers(PlanRound& r);

}  // namespace trellis::op
