// Leader election with a coordination.k8s.io/v1 Lease, so that two operator replicas can run:
// the holder renews the lease; another replica takes it only after leaseDurationSeconds without
// a renewal. Updates carry the lease's resourceVersion, so two candidates racing for an expired
// lease cannot both win (the loser gets 409).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "common/base/status.h"
#include "operator/kube_client.h"

namespace trellis::op {

struct LeaseOptions {
  std::string ns = "default";
  std::string name = "trellis-operator";
  std::string identity;  // unique per replica (pod name + random suffix)
  std::chrono::seconds duration{15};
};

// Pure: may `identity` take or renew `lease` (a Lease object) at `now`?
bool CanHoldLease(const Json& lease, const std::string& identity, Clock::time_point now);

// "2026-11-23T01:03:07.000000Z": the MicroTime format Lease fields require.
std::string FormatMicroTime(Clock::time_point t);

class LeaderElector {
 public:
  using Now = std::function<Clock::time_point()>;
  LeaderElector(KubeClient& client, LeaseOptions options, Now now);

  // One round: true when this replica holds the lease afterwards (acquired or renewed); false
  // when another replica holds it. Errors are API errors other than a lost race.
  StatusOr<bool> TryAcquireOrRenew();
  // Gives the lease up (as client-go's ReleaseOnCancel does): no holder, a 1 s duration, so a
  // standby takes over on its next try instead of waiting out leaseDurationSeconds. Call it
  // after reconciling has stopped. A lease held by another replica is left alone.
  Status Release();

 private:
  KubeClient& client_;
  LeaseOptions options_;
  Now now_;
};

}  // namespace trellis::op
