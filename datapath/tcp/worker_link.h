// The worker's link over raw TCP (protocol in wire.h): the transport that gets the data path
// close to the wire (docs/performance.md).
//
// One socket per worker-server pair: the server's local socket when it offers one and the
// worker reaches it (same host and network namespace), else its TCP port. ConnectTcpLink sends
// the hello (job token, worker rank) and waits for the server's answer within the timeout (wrong
// token: UNAUTHENTICATED). Then:
//  * Write queues the frame; the writer thread ("trellis-tcp-wr") sends queued frames with sendmsg
//    straight from the caller's memory (header + payload iovecs). A small frame with nothing
//    queued or being written is sent by the caller's thread itself as far as the socket takes it
//    without waiting (the writer sends the rest): one wake-up fewer on the latency path.
//  * The reader thread ("trellis-tcp-rd") reads each answer's header and hands the payload to the
//    receiver unread, so a pull's bytes go straight from the socket into the caller's `out`.
#pragma once

#include <memory>

#include "common/base/status.h"
#include "datapath/link.h"

namespace trellis::link {

// REQUIRES: options.address.tcp_port > 0 (else INVALID_ARGUMENT: the server advertised none).
StatusOr<std::unique_ptr<WorkerLink>> ConnectTcpLink(const LinkOptions& options);

}  // namespace trellis::link
