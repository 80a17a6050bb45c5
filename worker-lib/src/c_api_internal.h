// C++-only bridge into the C API (not installed, not public): lets tests and C++ hosts hand an
// existing trellis::Worker to C code, e.g. a worker from an in-process test cluster.
#pragma once

#include <memory>

#include "trellis/c_api.h"
#include "trellis/trellis.h"

namespace trellis {

// Takes ownership of `worker`; free the result with trellis_worker_destroy(). NULL if worker is.
trellis_worker_t* WrapWorkerForC(std::unique_ptr<Worker> worker);

}  // namespace trellis
