#include "pserver/parameter_server.h"

#include <algorithm>

#include "common/base/logging.h"
#include "datapath/grpc/frame.h"

namespace trellis {

StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Start(const PserverOptions& options) {
  if (options.store.num_workers < 1) {
    return InvalidArgumentError("num_workers must be >= 1, got " +
                                std::to_string(options.store.num_workers));
  }
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("port must be in [0, 65535], got " + std::to_string(options.port));
  }
  std::unique_ptr<ParameterServer> ps(new ParameterServer());
  ps->store_ = std::make_unique<SliceStore>(options.store);
  ps->serving_ = std::make_unique<ServingQueue>(ServingQueueOptions{
      options.service.pool_threads, options.service.inline_max_bytes});
  // What one connection may have read and not had served, on either transport.
  ReadAheadLimit read_ahead = options.service.read_ahead;
  if (read_ahead.bytes == 0) {
    read_ahead.bytes = 2 * static_cast<size_t>(wire::MaxMessageBytes(options.slice_bytes));
  }
  DataServiceOptions service = options.service;
  service.read_ahead = read_ahead;
  ps->service_ = std::make_unique<DataService>(ps->store_.get(), ps->serving_.get(), service);
  grpc::ServerBuilder builder;
  std::string addr = options.listen_host + ":" + std::to_string(options.port);
  if (addr.find(':') != addr.rfind(':') && options.listen_host.front() != '[') {
    addr = "[" + options.listen_host + "]:" + std::to_string(options.port);
  }
  builder.AddListeningPort(addr, ServerCredentials(options.tls), &ps->port_);
  builder.RegisterService(ps->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(wire::MaxMessageBytes(options.slice_bytes)));
  builder.SetMaxSendMessageSize(-1);
  wire::ApplyDataChannelArgs(
      [&](const char* name, int value) { builder.AddChannelArgument(name, value); });
  ps->server_ = builder.BuildAndStart();
  if (!ps->server_ || ps->port_ == 0) {
    return UnavailableError("parameter server could not listen on " + addr);
  }
  if (options.tcp_port >= 0) {
    TcpDataServerOptions to;
    to.listen_host = options.listen_host;
    to.port = options.tcp_port;
    to.token = options.service.token;
    to.slice_bytes = options.slice_bytes;
    to.tls = options.tls;
    to.limits = options.tcp_limits;
    to.read_ahead = read_ahead;
    to.local_socket = options.local_socket;
    auto tcp = TcpDataServer::Start(ps->store_.get(), ps->serving_.get(), to);
    if (!tcp.ok()) return tcp.status().Annotate("starting the TCP data listener");
    ps->tcp_ = std::move(*tcp);
  }
  return ps;
}

ParameterServer::~ParameterServer() { Shutdown(); }

void ParameterServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (tcp_) tcp_->Stop();
  serving_->Stop();  // after this, requests get UNAVAILABLE
  service_->Stop();
  // Open streams are cancelled after a short grace (workers may still be connected).
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
}

}  // namespace trellis
