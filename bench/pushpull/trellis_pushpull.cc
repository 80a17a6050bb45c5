#include "bench/pushpull/trellis_pushpull.h"

namespace trellis::bench {

std::string TrellisTopology::Name() const {
  return std::to_string(workers) + "w x " + std::to_string(servers) + "s";
}

bool TrellisAvailable() { return false; }

StatusOr<std::vector<TrellisSizeResult>> MeasureTrellis(const TrellisRunOptions&) {
  return UnimplementedError("the worker library is not built yet");
}

}  // namespace trellis::bench
