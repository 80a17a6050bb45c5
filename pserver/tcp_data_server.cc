#include "pserver/tcp_data_server.h"

#include <utility>

#include "common/base/logging.h"
#include "datapath/tcp_server_link.h"
#include "datapath/tcp_wire.h"
#include "pserver/front_door.h"

namespace trellis {

// An admitted worker: its link, and the front door that serves what the link reads.
struct TcpDataServer::Connection {
  std::shared_ptr<link::TcpServerLink> link;
  std::shared_ptr<FrontDoor> door;
};

TcpDataServer::TcpDataServer(SliceStore* store, ServingQueue* serving,
                             TcpDataServerOptions options)
    : store_(store), serving_(serving), options_(std::move(options)) {}

StatusOr<std::unique_ptr<TcpDataServer>> TcpDataServer::Start(
    SliceStore* store, ServingQueue* serving, const TcpDataServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("tcp port must be in [0, 65535], got " +
                                std::to_string(options.port));
  }
  std::unique_ptr<TcpDataServer> s(new TcpDataServer(store, serving, options));
  TRELLIS_ASSIGN_OR_RETURN(int listen_fd,
                           tcpwire::Listen(options.listen_host, options.port, &s->port_));
  std::vector<int> listen_fds = {listen_fd};
  if (options.local_socket && options.tls == nullptr) {
    auto name = tcpwire::NewLocalName();
    auto local = name.ok() ? tcpwire::ListenLocal(*name) : StatusOr<int>(name.status());
    if (local.ok()) {
      listen_fds.push_back(*local);
      s->local_name_ = *name;
    } else {
      TLOG_WARN << "no local data socket (workers on this host use TCP): "
                   << local.status().ToString();
    }
  }
  TcpDataServer* raw = s.get();
  TcpAdmission::Hooks hooks;
  hooks.check = [raw](const tcpwire::Hello& h) { return raw->CheckHello(h); };
  hooks.admit = [raw](AdmittedConnection c) { raw->Admit(std::move(c)); };
  hooks.admitted = [raw] { return raw->open_.load(); };
  hooks.on_wake = [raw] { raw->Reap(); };
  auto admission =
      TcpAdmission::Start(std::move(listen_fds), options.limits, options.tls, std::move(hooks));
  if (!admission.ok()) return admission.status();
  s->admission_ = std::move(*admission);
  return s;
}

TcpDataServer::~TcpDataServer() { Stop(); }

Status TcpDataServer::CheckHello(const tcpwire::Hello& hello) const {
  return CheckWorker(options_.token, hello.token, hello.rank, store_->config().num_workers);
}

void TcpDataServer::Admit(AdmittedConnection a) {
  tcpwire::TuneSocket(a.fd);
  TLOG_INFO << "worker " << a.rank << " connected from " << a.peer;
  if (a.tls) {
    TLOG_INFO << "data connection from " << a.peer << ": TLS, record layer in "
              << a.tls->OffloadName();
  }
  link::TcpServerLinkOptions o;
  o.peer = std::move(a.peer);
  o.worker = a.rank;
  o.max_payload = static_cast<uint64_t>(wire::MaxMessageBytes(options_.slice_bytes)) -
                  wire::kRequestHeaderBytes;
  o.read_ahead = options_.read_ahead;
  o.on_closed = [this] {
    open_.fetch_sub(1);
    admission_->Wake();  // reaps it
  };
  Connection c;
  c.link = link::TcpServerLink::Create(a.fd, std::move(a.tls), std::move(o));
  c.door = std::make_shared<FrontDoor>(store_, serving_, a.rank, c.link);
  open_.fetch_add(1);
  // False: refused, the link ended; reaped on this (the admission) thread's next wake-up.
  (void)c.link->Start(c.door);
  std::lock_guard lock(mu_);
  connections_.push_back(std::move(c));
}

void TcpDataServer::Reap() {
  std::vector<Connection> ended;
  {
    std::lock_guard lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (it->link->Ended()) {
        ended.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : ended) {
    c.link->Join();
    c.door->Clear();
  }
}

void TcpDataServer::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // The loop first: no connection is admitted or reaped after this.
  if (admission_) admission_->Stop();
  std::vector<Connection> conns;
  {
    std::lock_guard lock(mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) c.link->Kill();
  for (auto& c : conns) {
    c.link->Join();
    // Requests not served yet hold the connection: dropped here, not at the queue's end.
    c.door->Clear();
  }
}

}  // namespace trellis
