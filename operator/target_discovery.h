// Prometheus HTTP service discovery of every Trellis process (GET /sd/targets on the operator's
// metrics port; docs/metrics.md). A Prometheus without Kubernetes discovery (Debian's package is
// built without it) or outside the cluster finds every process through the operator, which knows
// the pods from its watches: no request to the API server per discovery.
#pragma once

#include <string>
#include <vector>

#include "operator/json_util.h"

namespace trellis::op {

// The target groups of one pod: one per container port named `metrics` (the program) or
// `agent-metrics` (its agent), "<podIP>:<port>", labelled namespace, pod, job, role, rank (workers
// and servers) and trellis_process (e.g. worker-0, worker-0-agent, scheduler: the names
// trellis-launch's file-SD targets carry). None for a pod that is not a TrainingJob's, has no
// address yet, or has ended.
std::vector<Json> PodTargetGroups(const Json& pod);

// The /sd/targets body: every pod's groups, then the operator itself at `self` (the Host the
// request came to, e.g. its metrics Service; skipped when empty), as Prometheus's http_sd wants:
// a JSON array of {"targets": [...], "labels": {...}}.
std::string TargetsJson(const std::vector<Json>& pods, const std::string& self);

}  // namespace trellis::op
