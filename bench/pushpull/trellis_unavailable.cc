// Built instead of trellis_pushpull.cc while the tree has no worker library: the bench still
// prints its baselines.
#include "bench/pushpull/trellis_pushpull.h"

namespace trellis::bench {

std::string TrellisTopology::Name() const {
  return std::to_string(workers) + "w x " + std::to_string(servers) + "s";
}

bool TrellisAvailable() { return false; }

StatusOr<std::vector<TrellisSizeResult>> MeasureTrellis(const TrellisRunOptions&) {
  return UnimplementedError("bench_pushpull was built without the worker library (target trellis)");
}

}  // namespace trellis::bench
