#include "datapath/connect.h"

#include "datapath/grpc/worker_link.h"
#include "datapath/tcp/worker_link.h"

namespace trellis::link {

StatusOr<Transport> ParseTransport(const std::string& name) {
  if (name == "grpc") return Transport::kGrpc;
  if (name == "tcp") return Transport::kTcp;
  return InvalidArgumentError("unknown transport '" + name + "': want grpc or tcp");
}

StatusOr<ConnectedLink> Connect(Transport transport, const LinkOptions& options) {
  ConnectedLink c;
  if (transport == Transport::kTcp) {
    TRELLIS_ASSIGN_OR_RETURN(c.link, ConnectTcpLink(options));
  } else {
    TRELLIS_ASSIGN_OR_RETURN(c.link, ConnectGrpcLink(options, &c.control));
  }
  return c;
}

}  // namespace trellis::link
