// Kubernetes Events about a TrainingJob (what `kubectl describe trainingjob` lists), recorded by
// the reconciler (phase changes, restarts) and the progress poller (programs restarted inside
// their pods).
#pragma once

#include <string>

#include "common/base/status.h"
#include "operator/json_util.h"
#include "operator/kube_client.h"

namespace trellis::op {

// Records an Event of `type` (Normal, Warning) about `job` (the object as read: its uid and
// resourceVersion name the Event, so the same event for the same state is recorded once).
Status RecordJobEvent(KubeClient& client, const Json& job, const std::string& type, const std::string& reason,
                      const std::string& message, Clock::time_point now);

}  // namespace trellis::op
