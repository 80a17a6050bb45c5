#include "pserver/tcp_data_server.h"

#include <utility>

#include "pserver/front_door.h"

namespace trellis {

StatusOr<std::unique_ptr<TcpDataServer>> TcpDataServer::Start(
    SliceStore* store, ServingQueue* serving, const TcpDataServerOptions& options) {
  link::TcpListenerOptions o;
  o.listen_host = options.listen_host;
  o.port = options.port;
  o.max_payload = static_cast<uint64_t>(wire::MaxMessageBytes(options.slice_bytes)) -
                  wire::kRequestHeaderBytes;
  o.tls = options.tls;
  o.limits = options.limits;
  o.local_socket = options.local_socket;
  o.read_ahead = options.read_ahead;
  link::TcpWorkerAdmission admission;
  admission.check = [store, token = options.token](const tcpwire::Hello& hello) {
    return CheckWorker(token, hello.token, hello.rank, store->config().slots());
  };
  admission.open = [store, serving](int32_t rank, std::shared_ptr<AnswerSink> sink) {
    return std::shared_ptr<link::RequestReceiver>(
        std::make_shared<FrontDoor>(store, serving, rank, std::move(sink)));
  };
  TRELLIS_ASSIGN_OR_RETURN(auto listener, link::TcpListener::Start(o, std::move(admission)));
  return std::unique_ptr<TcpDataServer>(new TcpDataServer(std::move(listener)));
}

}  // namespace trellis
