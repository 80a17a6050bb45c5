#include "pserver/tcp_data_server.h"

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <queue>

#include "common/auth.h"
#include "common/logging.h"
#include "pserver/tcp_wire.h"

namespace trellis {
namespace {

struct Outgoing {
  int32_t priority;
  uint64_t seq;
  std::vector<uint8_t> head;  // response header + message
  // The payload, sent straight from the store's result buffer: the float32 values, or the
  // packed answer when set.
  Values values;
  Packed packed;
  size_t PayloadBytes() const {
    return packed ? packed->size() : (values ? values->size() * sizeof(float) : 0);
  }
  const void* PayloadData() const {
    return packed ? static_cast<const void*>(packed->data()) : values->data();
  }
  bool operator<(const Outgoing& o) const {  // max-heap: higher priority, then FIFO
    return priority != o.priority ? priority < o.priority : seq > o.seq;
  }
};

constexpr size_t kMaxBatch = 16;  // frames per sendmsg
// Bytes per sendmsg: once a batch is handed to the kernel its order is fixed, so a batch stays
// small enough that a higher-priority answer queued meanwhile waits at most about this much.
constexpr size_t kMaxBatchBytes = 1 << 20;

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    port = ntohs(a->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

void SetRecvTimeout(int fd, int64_t ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

}  // namespace

struct TcpDataServer::Connection : std::enable_shared_from_this<Connection> {
  Connection(int f, SliceStore* s, const TcpDataServerOptions* o)
      : fd(f), store(s), options(o), peer(PeerName(f)) {}
  ~Connection() {
    tls.reset();
    if (fd >= 0) ::close(fd);
  }

  const int fd;
  SliceStore* const store;
  const TcpDataServerOptions* const options;
  const std::string peer;
  int32_t worker = -1;  // set by the reader after the hello
  std::thread reader;
  std::thread writer;
  std::atomic<int> threads_running{2};
  // Set by the reader after the TLS handshake, before anything is queued for the writer.
  std::unique_ptr<TlsStream> tls;

  std::mutex mu;
  std::condition_variable cv;
  std::priority_queue<Outgoing> out;  // GUARDED_BY(mu)
  uint64_t seq = 0;                   // GUARDED_BY(mu)
  bool closing = false;               // GUARDED_BY(mu): flush what is queued, then close
  bool dead = false;                  // GUARDED_BY(mu): nothing more is written

  void Send(Outgoing o) {
    {
      std::lock_guard lock(mu);
      if (closing || dead) return;  // the worker is gone or the stream is being closed
      o.seq = seq++;
      out.push(std::move(o));
    }
    cv.notify_one();
  }
  void SendStatus(wire::Op op, uint64_t id, const Status& st) {
    // Errors jump the queue: the worker's handle fails at once.
    Send(Outgoing{INT32_MAX, 0, tcpwire::EncodeStatusFrame(op, id, st), nullptr, nullptr});
  }
  void CloseAfterFlush() {
    {
      std::lock_guard lock(mu);
      closing = true;
    }
    cv.notify_one();
  }
  void Kill() {
    ::shutdown(fd, SHUT_RDWR);
    {
      std::lock_guard lock(mu);
      dead = true;
    }
    cv.notify_one();
  }

  Status Hello(tcpwire::SocketReader& rd);
  void ReadLoop();
  // Hands one request (header + payload in `frame`) to the store; the answer is queued by
  // priority. The store has read the payload when this returns.
  void Serve(const wire::RequestHeader& h, const wire::Chunks& frame,
             std::vector<float>* payload = nullptr);
  void WriteLoop();
};

Status TcpDataServer::Connection::Hello(tcpwire::SocketReader& rd) {
  uint8_t h[tcpwire::kHelloFixedBytes];
  Status st = rd.Read(h, sizeof h);
  if (!st.ok()) return UnavailableError("no hello: " + st.message());
  uint32_t magic, version, token_len;
  int32_t rank;
  std::memcpy(&magic, h, 4);
  std::memcpy(&version, h + 4, 4);
  std::memcpy(&rank, h + 8, 4);
  std::memcpy(&token_len, h + 12, 4);
  if (magic != tcpwire::kHelloMagic) {
    return InvalidArgumentError("bad hello: not a trellis data connection (bad magic)");
  }
  if (version != tcpwire::kHelloVersion) {
    return InvalidArgumentError("bad hello: protocol version " + std::to_string(version) +
                                ", this server speaks " + std::to_string(tcpwire::kHelloVersion));
  }
  if (token_len > tcpwire::kMaxTokenBytes) {
    return InvalidArgumentError("bad hello: token of " + std::to_string(token_len) +
                                " bytes (limit " + std::to_string(tcpwire::kMaxTokenBytes) + ")");
  }
  std::string token(token_len, '\0');
  if (token_len > 0) {
    st = rd.Read(token.data(), token_len);
    if (!st.ok()) return UnavailableError("truncated hello: " + st.message());
  }
  if (!options->token.empty()) {
    if (token.empty()) return UnauthenticatedError("missing job token");
    if (!TokenEquals(options->token, token)) return UnauthenticatedError("wrong job token");
  }
  int32_t w = store->config().num_workers;
  if (rank < 0 || rank >= w) {
    return InvalidArgumentError("worker rank " + std::to_string(rank) + " outside [0, " +
                                std::to_string(w) + ")");
  }
  worker = rank;
  return Status::Ok();
}

void TcpDataServer::Connection::ReadLoop() {
  constexpr int64_t kHelloTimeoutMs = 10000;  // a peer that connects and says nothing is dropped
  if (options->tls) {
    // Mutual TLS first: a peer without a certificate of the job's CA never reaches the hello.
    auto stream = TlsStream::Handshake(*options->tls->server_ctx, fd, kHelloTimeoutMs);
    if (!stream.ok()) {
      TLOG_WARN << "refusing data connection from " << peer << ": " << stream.status().ToString();
      CloseAfterFlush();
      return;
    }
    (*stream)->set_read_timeout_ms(kHelloTimeoutMs);
    TLOG_INFO << "data connection from " << peer << ": TLS, record layer in "
              << (*stream)->OffloadName();
    std::lock_guard lock(mu);
    tls = std::move(*stream);
  }
  tcpwire::SocketReader rd(fd, 64 << 10, tls.get());
  SetRecvTimeout(fd, kHelloTimeoutMs);
  Status st = Hello(rd);
  if (!st.ok()) {
    TLOG_WARN << "refusing data connection from " << peer << ": " << st.ToString();
    SendStatus(static_cast<wire::Op>(0), 0, st);
    CloseAfterFlush();
    return;
  }
  SetRecvTimeout(fd, 0);
  if (tls) tls->set_read_timeout_ms(0);
  SendStatus(static_cast<wire::Op>(0), 0, Status::Ok());
  const uint64_t max_payload =
      static_cast<uint64_t>(wire::MaxMessageBytes(options->slice_bytes)) -
      wire::kRequestHeaderBytes;
  // The payload buffer, reused for every request: grown to the largest payload seen (bounded by
  // max_payload) and zero-filled once, so no request pays page faults on fresh memory.
  std::vector<float> payload;
  while (true) {
    uint8_t head[wire::kRequestHeaderBytes];
    st = rd.Read(head, sizeof head);
    if (!st.ok()) break;  // the worker went away (or Stop)
    wire::RequestHeader h;
    st = tcpwire::DecodeRequestHeader(head, max_payload, &h);
    if (!st.ok()) {
      TLOG_WARN << "data connection from " << peer << " (worker " << worker
                << "): " << st.ToString();
      uint64_t id;
      std::memcpy(&id, head + 8, sizeof id);
      SendStatus(wire::Op::kPush, id, st);
      break;
    }
    // Rounded up: a 2-bit frame need not be a whole number of floats.
    const size_t n = (h.payload_bytes + sizeof(float) - 1) / sizeof(float);
    if (payload.size() < n) payload.resize(n);
    if (h.payload_bytes > 0) {
      st = rd.Read(payload.data(), h.payload_bytes);
      if (!st.ok()) break;  // truncated frame: the peer closed mid-payload
    }
    wire::Chunks chunks = {std::span<const uint8_t>(head, sizeof head),
                           std::span<const uint8_t>(
                               reinterpret_cast<const uint8_t*>(payload.data()),
                               h.payload_bytes)};
    if (h.op != wire::Op::kBulk) {
      // The store may take `payload` (a first push) and leave a buffer of the same size.
      Serve(h, chunks, h.payload_bytes == payload.size() * sizeof(float) ? &payload : nullptr);
      continue;
    }
    std::vector<wire::BulkEntry> entries;
    st = wire::ParseBulk(chunks, wire::kRequestHeaderBytes, h.payload_bytes, &entries);
    if (!st.ok()) {
      // The frame was read whole, so the stream is still in step: refuse the bulk, keep going.
      TLOG_WARN << "data connection from " << peer << " (worker " << worker
                << "): " << st.ToString();
      SendStatus(wire::Op::kBulk, h.request_id, st);
      continue;
    }
    for (const auto& e : entries) Serve(e.header, wire::SubChunks(chunks, e.offset, e.bytes));
  }
  CloseAfterFlush();
}

void TcpDataServer::Connection::Serve(const wire::RequestHeader& h, const wire::Chunks& frame,
                                      std::vector<float>* payload) {
  store->Handle(worker, h, frame, [self = shared_from_this(), op = h.op, id = h.request_id,
                                   priority = h.priority](const Status& s, Answer answer) {
    if (!s.ok()) {
      self->SendStatus(op, id, s);
      return;
    }
    Outgoing o{priority, 0, std::vector<uint8_t>(wire::kResponseHeaderBytes), nullptr, nullptr};
    if (answer.packed) {
      o.packed = std::move(answer.packed);  // only what is sent is held
    } else {
      o.values = std::move(answer.values);
    }
    wire::ResponseHeader r;
    r.op = op;
    r.request_id = id;
    r.packed = o.packed != nullptr;
    r.payload_bytes = o.PayloadBytes();
    wire::EncodeResponseHeader(r, o.head.data());
    self->Send(std::move(o));
  }, payload);
}

void TcpDataServer::Connection::WriteLoop() {
  std::unique_lock lock(mu);
  std::vector<Outgoing> batch;
  std::vector<iovec> iov;
  while (true) {
    cv.wait(lock, [this] { return dead || closing || !out.empty(); });
    if (dead || out.empty()) break;  // killed, or closing with everything flushed
    batch.clear();
    iov.clear();
    size_t batch_bytes = 0;
    while (!out.empty() && batch.size() < kMaxBatch && batch_bytes < kMaxBatchBytes) {
      batch.push_back(std::move(const_cast<Outgoing&>(out.top())));
      out.pop();
      batch_bytes += batch.back().head.size() + batch.back().PayloadBytes();
    }
    lock.unlock();
    for (auto& o : batch) {
      iov.push_back({o.head.data(), o.head.size()});
      if (o.PayloadBytes() > 0) {
        iov.push_back({const_cast<void*>(o.PayloadData()), o.PayloadBytes()});
      }
    }
    Status st = tcpwire::SendAll(fd, tls.get(), iov.data(), static_cast<int>(iov.size()));
    batch.clear();  // releases the result buffers
    lock.lock();
    if (!st.ok()) break;  // the worker is gone
  }
  dead = true;
  while (!out.empty()) out.pop();
  lock.unlock();
  // Ends the byte stream after the last answer (the worker reads an error frame, then EOF) and
  // wakes the reader if it still waits.
  ::shutdown(fd, SHUT_RDWR);
}

TcpDataServer::TcpDataServer(SliceStore* store, TcpDataServerOptions options)
    : store_(store), options_(std::move(options)) {}

StatusOr<std::unique_ptr<TcpDataServer>> TcpDataServer::Start(
    SliceStore* store, const TcpDataServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgumentError("tcp port must be in [0, 65535], got " +
                                std::to_string(options.port));
  }
  std::unique_ptr<TcpDataServer> s(new TcpDataServer(store, options));
  TRELLIS_ASSIGN_OR_RETURN(s->listen_fd_,
                           tcpwire::Listen(options.listen_host, options.port, &s->port_));
  TcpDataServer* raw = s.get();
  s->acceptor_ = std::thread([raw] {
    pthread_setname_np(pthread_self(), "pserver-tcp-acc");
    raw->AcceptLoop();
  });
  return s;
}

TcpDataServer::~TcpDataServer() { Stop(); }

void TcpDataServer::AcceptLoop() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard lock(mu_);
    if (stopped_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        TLOG_WARN << "accept: " << std::strerror(errno);
        poll(nullptr, 0, 100);  // back off instead of spinning while out of descriptors
      }
      continue;
    }
    tcpwire::TuneSocket(fd);
    auto c = std::make_shared<Connection>(fd, store_, &options_);
    Connection* raw = c.get();
    c->reader = std::thread([raw] {
      pthread_setname_np(pthread_self(), "pserver-tcp-rd");
      raw->ReadLoop();
      raw->threads_running.fetch_sub(1);
    });
    c->writer = std::thread([raw] {
      pthread_setname_np(pthread_self(), "pserver-tcp-wr");
      raw->WriteLoop();
      raw->threads_running.fetch_sub(1);
    });
    ReapLocked();
    connections_.push_back(std::move(c));
  }
}

void TcpDataServer::ReapLocked() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->threads_running.load() == 0) {
      (*it)->reader.join();
      (*it)->writer.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpDataServer::Stop() {
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    conns.swap(connections_);
  }
  // shutdown(2) wakes accept(); close only after the acceptor is gone.
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  for (auto& c : conns) c->Kill();
  for (auto& c : conns) {
    c->reader.join();
    c->writer.join();
  }
}

}  // namespace trellis
