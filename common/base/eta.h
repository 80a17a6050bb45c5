// A remaining time as people read it ("45s", "12m30s", "3h05m", "2d04h"): the ETA column of
// `kubectl get tj` and trellis-launch's live line.
#pragma once

#include <string>

namespace trellis {

// "" for a negative or non-finite value (not known).
std::string FormatEta(double seconds);

}  // namespace trellis
