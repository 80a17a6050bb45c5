// Elastic servers: a parameter server lost for good is taken over by the pod of a live server
// (docs/elastic.md#losing-a-server). That pod's agent starts one more agent for the lost rank
// (HeartbeatResponse.take_over_servers), which runs the rank's program there; the workers find
// its new address in the cluster view and rebuild its slices as for any restarted server
// (retained pushes; in update mode its newest checkpoint too). Nothing on the data path changes:
// the shard map keeps its servers, one pod serves two ranks.
#include <limits>

#include "common/base/logging.h"
#include "scheduler/scheduler_state.h"

namespace trellis {

bool SchedulerState::TakeOverServerLocked(int32_t rank, const std::string& why, Deferred* deferred) {
  if (!config_.servers_elastic() || failed_ || !stop_reason_.empty()) return false;
  // The job is ending (a worker finished): its servers stop, nothing is taken over.
  if (members_.AnyWorkerExited()) return false;
  const Membership::Member& lost = members_.at(v1::ROLE_SERVER, rank);
  if (lost.departed || rank >= world_.servers()) return false;  // resized away: not in the world
  if (!lost.taken_over_by.empty() && !lost.served_since_takeover) {
    FailJobLocked(why + "; it had been taken over by pod " + lost.taken_over_by +
                      ", where its program ended before it served: the job cannot go on without it",
                  deferred);
    return true;
  }
  // The live server in the world that took over the fewest ranks, the lowest rank first. A
  // takeover itself takes none over (its pod already runs two servers).
  int32_t by = -1;
  size_t fewest = std::numeric_limits<size_t>::max();
  for (int32_t r = 0; r < world_.servers(); ++r) {
    if (r == rank || !members_.ServerReady(r)) continue;
    const Membership::Member& m = members_.at(v1::ROLE_SERVER, r);
    if (m.departed || !m.taken_over_by.empty()) continue;
    const size_t taken = members_.TakenOverBy(m.pod_name).size();
    if (taken < fewest) {
      fewest = taken;
      by = r;
    }
  }
  if (by < 0) {
    FailJobLocked(why + "; no other server is live to take its shards over", deferred);
    return true;
  }
  const std::string by_pod = members_.at(v1::ROLE_SERVER, by).pod_name;
  const std::string pod = members_.TakeOverServer(rank, by);
  ++servers_taken_over_;
  TLOG_WARN << why << ": server " << by << "'s pod " << by_pod << " takes its shards over (spec.elastic "
            << "sets the servers' bounds); it runs server " << rank << "'s program from now on (registering as "
            << pod << "), and the workers rebuild its slices there";
  ChangedLocked(deferred);
  return true;
}

}  // namespace trellis
