// Whether a worker keeps its last pushes for a restarted server (spec.recovery.retainPushes,
// docs/checkpoints.md "Crash recovery: servers").
#pragma once

#include "common/job/job_spec.h"

namespace trellis {

// Retention is a copy of every pushed byte on the pushing thread and twice the gradients in
// memory; it only pays off when a dead server comes back. With the servers' restartPolicy
// Never nothing restarts them, so nothing is kept (a server's death fails its operations, as
// with retainPushes: false) -- unless the servers are elastic (minServers < maxServers): then a
// server lost for good is taken over by another's pod and rebuilt there
// (docs/elastic.md#losing-a-server).
inline bool RetainsPushes(const JobSpec& job) {
  const bool taken_over = job.elastic.enabled && job.elastic.minServers < job.elastic.maxServers;
  return job.recovery.retainPushes && (taken_over || job.RestartPolicyFor(job.servers) != RestartPolicy::kNever);
}

}  // namespace trellis
