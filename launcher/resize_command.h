// trellis-launch resize RUN_DIR WORKERS, or RUN_DIR --servers SERVERS: resizes a running
// elastic job's workers or servers (docs/elastic.md). The running launcher keeps in
// RUN_DIR/scheduler.client where its scheduler is and how to reach it (WriteSchedulerClientFile);
// this command asks that scheduler for the new size and waits (at most `wait`) until the workers
// agreed on the step it takes effect at.
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tls/tls.h"

namespace trellis {

// RUN_DIR/scheduler.client: "address=HOST:PORT" and, for a job with TLS, "ca=", "cert=",
// "key=", "server_name=" lines. Written atomically (a temporary file renamed).
Status WriteSchedulerClientFile(const std::string& run_dir, const std::string& address,
                                const TlsFiles& tls);

// `args` after "resize": RUN_DIR WORKERS, or RUN_DIR --servers SERVERS. Prints what happened to
// `out`; returns the exit code (0 resized or nothing to do, 1 refused or not decided in time, 2
// bad arguments).
int RunResizeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
                     std::chrono::milliseconds wait = std::chrono::seconds(60));

}  // namespace trellis
