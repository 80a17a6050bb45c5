// The server's raw-TCP listener; see listener.h.
#include "datapath/tcp/listener.h"

#include <utility>

#include "common/base/logging.h"
#include "datapath/address.h"

namespace trellis::link {

TcpListener::TcpListener(TcpListenerOptions options, TcpWorkerAdmission admission)
    : options_(std::move(options)), admission_(std::move(admission)) {}

StatusOr<std::unique_ptr<TcpListener>> TcpListener::Start(const TcpListenerOptions& options,
                                                          TcpWorkerAdmission admission) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("tcp port must be in [0, 65535], got " +
                                std::to_string(options.port));
  }
  std::unique_ptr<TcpListener> s(new TcpListener(options, std::move(admission)));
  TRELLIS_ASSIGN_OR_RETURN(int listen_fd,
                           tcpwire::Listen(options.listen_host, options.port, &s->port_));
  std::vector<int> listen_fds = {listen_fd};
  if (options.local_socket && options.tls == nullptr) {
    auto name = NewLocalName();
    auto local = name.ok() ? tcpwire::ListenLocal(*name) : StatusOr<int>(name.status());
    if (local.ok()) {
      listen_fds.push_back(*local);
      s->local_name_ = *name;
    } else {
      TLOG_WARN << "no local data socket (workers on this host use TCP): "
                   << local.status().ToString();
    }
  }
  TcpListener* raw = s.get();
  TcpAdmission::Hooks hooks;
  hooks.check = raw->admission_.check;
  hooks.admit = [raw](AdmittedConnection c) { raw->Admit(std::move(c)); };
  hooks.admitted = [raw] { return raw->open_.load(); };
  hooks.on_wake = [raw] { raw->Reap(); };
  auto loop =
      TcpAdmission::Start(std::move(listen_fds), options.limits, options.tls, std::move(hooks));
  if (!loop.ok()) return loop.status();
  s->loop_ = std::move(*loop);
  return s;
}

TcpListener::~TcpListener() { Stop(); }

void TcpListener::Admit(AdmittedConnection a) {
  tcpwire::TuneSocket(a.fd);
  TLOG_INFO << "worker " << a.rank << " connected from " << a.peer;
  if (a.tls) {
    TLOG_INFO << "data connection from " << a.peer << ": TLS, record layer in "
              << a.tls->OffloadName();
  }
  TcpServerLinkOptions o;
  o.peer = std::move(a.peer);
  o.worker = a.rank;
  o.max_payload = options_.max_payload;
  o.read_ahead = options_.read_ahead;
  o.on_closed = [this] {
    open_.fetch_sub(1);
    loop_->Wake();  // reaps it
  };
  Connection c;
  c.link = TcpServerLink::Create(a.fd, std::move(a.tls), std::move(o));
  c.receiver = admission_.open(a.rank, c.link);
  open_.fetch_add(1);
  // False: refused, the link ended; reaped on this (the admission) thread's next wake-up.
  (void)c.link->Start(c.receiver);
  MutexLock lock(&mu_);
  connections_.push_back(std::move(c));
}

void TcpListener::Reap() {
  std::vector<Connection> ended;
  {
    MutexLock lock(&mu_);
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
    c.receiver->Clear();
  }
}

void TcpListener::Stop() {
  {
    MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // The loop first: no connection is admitted or reaped after this.
  if (loop_) loop_->Stop();
  std::vector<Connection> conns;
  {
    MutexLock lock(&mu_);
    conns.swap(connections_);
  }
  for (auto& c : conns) c.link->Kill();
  for (auto& c : conns) {
    c.link->Join();
    // Requests not served yet hold the connection: dropped here, not at the queue's end.
    c.receiver->Clear();
  }
}

}  // namespace trellis::link
