// The worker's way onto the data path: a link to one server over the job's transport
// (spec.transport), from the server's data address (address.h). The one place that knows which
// transports there are; above it the worker sees a WorkerLink (link.h) whatever carries it.
#pragma once

#include <memory>
#include <string>

#include "common/base/status.h"
#include "datapath/link.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace trellis::link {

enum class Transport {
  kGrpc,  // a gRPC stream to the server's service (datapath/grpc/)
  kTcp,   // raw TCP, or the server's local socket when reachable (datapath/tcp/)
};
// "grpc" or "tcp"; anything else INVALID_ARGUMENT naming the choices.
StatusOr<Transport> ParseTransport(const std::string& name);

struct ConnectedLink {
  std::unique_ptr<WorkerLink> link;  // not started yet (WorkerLink::Start)
  // The link's own gRPC channel to the server, for its control calls (DataService's unary
  // methods, always gRPC); nullptr when the transport has none (the caller makes one).
  std::shared_ptr<grpc::Channel> control;
};

// Connects within options.timeout_ms (TCP: the socket and its hello; gRPC: nothing is waited
// for, the stream waits for the server). Errors name the server.
StatusOr<ConnectedLink> Connect(Transport transport, const LinkOptions& options);

}  // namespace trellis::link
