// A parameter server: the slice store + data service behind a gRPC server, and the raw-TCP bulk
// listener (pserver/tcp_data_server.h) over the same store; both hand their requests to one
// serving queue (pserver/serving_queue.h), served highest priority first.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "common/tls/tls.h"
#include "pserver/data_service.h"
#include "pserver/serving_queue.h"
#include "pserver/slice_store.h"
#include "pserver/tcp_data_server.h"

namespace trellis {

struct PserverOptions {
  std::string listen_host = "0.0.0.0";
  int port = 0;  // 0: pick a free port
  StoreConfig store;
  DataServiceOptions service;
  int64_t slice_bytes = 4 << 20;  // sizes the receive limit (a slice + header)
  int tcp_port = 0;  // the raw-TCP bulk listener: 0 picks a free port, -1: none
  TlsPtr tls;        // mutual TLS on both listeners (common/tls/tls.h); nullptr: plaintext
  TcpAdmissionLimits tcp_limits;  // before a hello (datapath/tcp/admission.h)
  bool local_socket = false;  // also a local socket beside the TCP port (TcpDataServerOptions)
};

class ParameterServer {
 public:
  static StatusOr<std::unique_ptr<ParameterServer>> Start(const PserverOptions& options);
  ~ParameterServer();  // Shutdown()

  int port() const { return port_; }
  int tcp_port() const { return tcp_ ? tcp_->port() : 0; }  // 0: no TCP listener
  // The local socket's name (for the data address); empty: none.
  std::string local_name() const { return tcp_ ? tcp_->local_name() : std::string(); }
  SliceStore* store() { return store_.get(); }
  ServingQueue* serving() { return serving_.get(); }
  // Fails waiting pulls, stops serving; idempotent.
  void Shutdown();

 private:
  ParameterServer() = default;
  std::unique_ptr<SliceStore> store_;
  std::unique_ptr<ServingQueue> serving_;  // both transports' requests
  std::unique_ptr<DataService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<TcpDataServer> tcp_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace trellis
