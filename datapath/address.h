// A parameter server's data address: how the server publishes where its workers reach it
// (ReportReady, the scheduler's cluster view) and how every worker reads it. Parsed once here,
// so that neither side knows the text's format:
//   "host:port"                     the server's gRPC service (control calls and the gRPC link)
//   "host:port;tcp=P"               and its raw-TCP port (datapath/tcp/)
//   "host:port;tcp=P;local=NAME"    and its local socket (a Unix socket in the abstract
//                                   namespace, reachable only from the server's own network
//                                   namespace; the TCP protocol runs over it: datapath/tcp/)
// Which of them a worker uses is its transport's business (datapath/connect.h).
#pragma once

#include <string>

#include "common/base/status.h"

namespace trellis {

struct DataAddress {
  std::string service;     // "host:port" of the gRPC service
  int tcp_port = 0;        // the raw-TCP port; 0: none
  std::string local_name;  // the local socket's name (CheckLocalName); empty: none

  // INVALID_ARGUMENT naming the (cut, printable) text and what is wrong: a port outside
  // [1, 65535], a local name not of NewLocalName's form, a local socket without a TCP port.
  static StatusOr<DataAddress> Parse(const std::string& text);
  // The text Parse reads back; the local name is left out without a TCP port.
  std::string ToString() const;
};

// A local socket's name is exactly what NewLocalName makes: "trellis-" and 32 lowercase hex
// digits. Anything else (another program's socket, a hostile address) is refused.
Status CheckLocalName(const std::string& name);
// A fresh name for a server's local socket: "trellis-" and 32 random hex digits (getrandom), so
// that no other server's name is ever reached by mistake. UNAVAILABLE without randomness.
StatusOr<std::string> NewLocalName();

}  // namespace trellis
