// The worker's link over gRPC: one channel per worker-server pair and one long-lived raw
// bidirectional stream on it (DataService.Stream, generic stub + callback reactor) carrying the
// same frames as the TCP link. Request frames reference the caller's memory (no copy). The worker
// opens it through datapath/connect.h.
#pragma once

#include <memory>

#include <grpcpp/channel.h>

#include "common/base/status.h"
#include "datapath/link.h"

namespace trellis::link {

// Never fails for a well-formed address: the stream waits for the server (wait_for_ready) and a
// server that never answers shows as requests that time out above the link. `*channel` (optional)
// receives the channel, for control calls to the same server.
StatusOr<std::unique_ptr<WorkerLink>> ConnectGrpcLink(const LinkOptions& options,
                                                      std::shared_ptr<grpc::Channel>* channel);

}  // namespace trellis::link
