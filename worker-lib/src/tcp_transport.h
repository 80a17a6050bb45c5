// ServerConnection over raw TCP (protocol in datapath/tcp_wire.h): the bulk transport that gets
// the data path close to the wire (docs/performance.md).
//
// One socket per worker-server pair. Connect sends the hello (job token, worker rank) and waits
// for the server's answer within the timeout (wrong token: UNAUTHENTICATED). Then:
//  * Send queues the request (never blocks); the writer thread ("trellis-tcp-wr") sends queued
//    frames with sendmsg straight from the caller's gradient memory (header + payload iovecs).
//    A small request with nothing queued or being written is sent by the caller's thread itself
//    as far as the socket takes it without waiting (the writer sends the rest): one wake-up
//    fewer on the latency path.
//  * The reader thread ("trellis-tcp-rd") reads each answer's header, finds the request by id and
//    reads the payload straight into the request's `out` (no intermediate buffer), under the
//    operation's data lock so nothing lands after the operation completed.
//  * InstallShardMap is a control call and stays a gRPC unary call to the same server.
// A broken connection fails every pending request with UNAVAILABLE (CANCELLED when closing);
// the destructor shuts the socket down and joins both threads.
#pragma once

#include <memory>

#include "common/status.h"
#include "worker-lib/src/transport.h"

namespace trellis {

// REQUIRES: options.tcp_port > 0 (else INVALID_ARGUMENT: the server advertised no TCP port).
StatusOr<std::unique_ptr<ServerConnection>> ConnectTcp(const ConnectionOptions& options);

}  // namespace trellis
