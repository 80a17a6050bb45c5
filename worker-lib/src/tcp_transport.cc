// ServerConnection over raw TCP; see tcp_transport.h.
#include "worker-lib/src/tcp_transport.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/net.h"
#include "datapath/tcp_wire.h"
#include "worker-lib/src/pending_answers.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/shard_map_install.h"

namespace trellis {
namespace {

constexpr size_t kMaxBatch = 32;  // frames per sendmsg
// Payloads the caller's thread may send itself (SendInline): up to 1 MiB, a copy of ~0.1-0.3 ms.
// Bigger ones (whole 4 MiB slices) go to the writer thread so that a training script's backward
// pass, which queues gradients as they are computed, does not spend its own time copying them
// into the kernel while a core may be free to do it.
constexpr uint64_t kInlineSendMaxBytes = 1 << 20;

void SetRecvTimeout(int fd, int64_t ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// Holds the operation's data lock (shared) while bytes land in `out`; refuses once the
// operation completed.
class OutGuard final : public tcpwire::WriteGuard {
 public:
  OutGuard(std::shared_mutex* mu, const std::atomic<bool>* closed) : mu_(mu), closed_(closed) {}
  bool Begin() override {
    if (mu_ == nullptr) return true;
    mu_->lock_shared();
    if (closed_ != nullptr && closed_->load()) {
      mu_->unlock_shared();
      return false;
    }
    return true;
  }
  void End() override {
    if (mu_ != nullptr) mu_->unlock_shared();
  }

 private:
  std::shared_mutex* const mu_;
  const std::atomic<bool>* const closed_;
};

class TcpConnection final : public ServerConnection {
 public:
  TcpConnection(const ConnectionOptions& o, int fd, std::unique_ptr<TlsStream> tls,
                std::unique_ptr<tcpwire::SocketReader> rd)
      : options_(o),
        fd_(fd),
        tls_(std::move(tls)),
        reader_(std::move(rd)),
        max_payload_(static_cast<uint64_t>(wire::MaxMessageBytes(o.slice_bytes))) {
    read_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "trellis-tcp-rd");
      ReadLoop();
    });
    write_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "trellis-tcp-wr");
      WriteLoop();
    });
  }

  ~TcpConnection() override {
    {
      std::lock_guard lock(mu_);
      closing_ = true;
    }
    ::shutdown(fd_, SHUT_RDWR);  // wakes both threads; the reader fails what is pending
    read_thread_.join();
    write_thread_.join();
    reader_.reset();
    tls_.reset();
    ::close(fd_);
  }

  const std::string& address() const override { return options_.address; }

  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                         int64_t timeout_ms) override {
    if (!control_) {
      grpc::ChannelArguments args;
      auto creds = ChannelCredentials(options_.tls, &args);
      control_ = v1::DataService::NewStub(grpc::CreateCustomChannel(options_.address, creds, args));
    }
    return InstallShardMapOnServer(control_.get(), options_, map, server_rank, timeout_ms);
  }

  using ServerConnection::Send;
  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) override {
    Frame f;
    wire::RequestHeader h = HeaderOf(r);
    f.payload = PayloadData(r);
    f.payload_bytes = h.payload_bytes;
    f.encoded = r.encoded;
    f.sent = std::move(sent);
    Status dead;
    {
      std::unique_lock lock(mu_);
      if (broken_) {
        dead = broken_status_;
      } else {
        h.request_id = pending_.Add(r, std::move(reply));
        wire::EncodeRequestHeader(h, f.head);
        if (tls_ == nullptr && !writing_ && queue_.empty() &&
            f.payload_bytes <= kInlineSendMaxBytes) {
          SendInline(std::move(f), lock);
          return;
        }
        queue_.push_back(std::move(f));
      }
    }
    if (!dead.ok()) {
      reply(dead, Payload{});
      return;
    }
    cv_.notify_all();
  }

  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) override {
    Frame f;
    f.sent = std::move(sent);
    f.entries.resize(requests.size());
    wire::RequestHeader bulk;
    bulk.op = wire::Op::kBulk;
    bulk.priority = requests.front().priority;
    for (size_t i = 0; i < requests.size(); ++i) {
      f.entries[i].payload = PayloadData(requests[i]);
      f.entries[i].payload_bytes = PayloadBytes(requests[i]);
      f.entries[i].encoded = requests[i].encoded;
      bulk.payload_bytes += wire::kRequestHeaderBytes + f.entries[i].payload_bytes;
    }
    Status dead;
    {
      std::lock_guard lock(mu_);
      if (broken_) {
        dead = broken_status_;
      } else {
        uint64_t first_entry = 0;
        bulk.request_id = pending_.AddBulk(requests, std::move(replies), &first_entry);
        wire::EncodeRequestHeader(bulk, f.head);
        for (size_t i = 0; i < requests.size(); ++i) {
          wire::RequestHeader h = HeaderOf(requests[i]);
          h.request_id = first_entry + i;
          wire::EncodeRequestHeader(h, f.entries[i].head);
        }
        queue_.push_back(std::move(f));
      }
    }
    if (!dead.ok()) {
      for (auto& reply : replies) reply(dead, Payload{});
      return;
    }
    cv_.notify_all();
  }

 private:
  struct Frame {
    uint8_t head[wire::kRequestHeaderBytes];
    const void* payload = nullptr;  // the caller's memory (or `encoded`), sent without a copy
    uint64_t payload_bytes = 0;
    size_t skip = 0;  // bytes the caller's thread already sent (SendInline)
    SliceSent sent;  // may be empty
    struct Entry {    // a bulk's entries, after `head` (whose payload they are)
      uint8_t head[wire::kRequestHeaderBytes];
      const void* payload = nullptr;
      uint64_t payload_bytes = 0;
      std::shared_ptr<const std::vector<uint8_t>> encoded;  // as Frame::encoded
    };
    std::vector<Entry> entries;
    // A compressed push's frame: held until the write that sends it returned.
    std::shared_ptr<const std::vector<uint8_t>> encoded;
  };
  // The caller's thread sends a frame when nothing is queued or being written (one wake-up of the
  // writer fewer per request), as far as the socket takes it without waiting; the writer sends
  // the rest. `sent` then runs here, after the lock is let go.
  void SendInline(Frame f, std::unique_lock<std::mutex>& lock) {
    writing_ = true;
    lock.unlock();
    iovec iov[2] = {{f.head, sizeof f.head}, {const_cast<void*>(f.payload), f.payload_bytes}};
    size_t sent = 0;
    Status st = tcpwire::SendNow(fd_, iov, f.payload_bytes > 0 ? 2 : 1, &sent);
    SliceSent done;
    lock.lock();
    writing_ = false;
    if (!st.ok()) {
      ::shutdown(fd_, SHUT_RDWR);  // the reader fails what is pending
    } else if (sent < sizeof f.head + f.payload_bytes) {
      f.skip = sent;
      queue_.push_front(std::move(f));
    } else {
      done = std::move(f.sent);
    }
    lock.unlock();
    cv_.notify_all();  // the writer (the rest, or what queued meanwhile), Break
    if (done) done();
  }

  void ReadLoop() {
    Status st;
    std::string message;
    // Packed answers, and answers that do not fit `out` (reported as errors).
    std::vector<float> scratch;
    while (true) {
      uint8_t head[wire::kResponseHeaderBytes];
      st = reader_->Read(head, sizeof head);
      if (!st.ok()) break;
      wire::ResponseHeader h;
      st = tcpwire::DecodeResponseHeader(head, max_payload_, &h);
      if (!st.ok()) break;
      message.resize(h.message_bytes);
      if (h.message_bytes > 0) {
        st = reader_->Read(message.data(), h.message_bytes);
        if (!st.ok()) break;
      }
      PendingAnswers::Routed routed;
      {
        std::lock_guard lock(mu_);
        routed = pending_.Take(h.request_id, h.code);
      }
      // The entries of a bulk the server refused as a whole.
      for (auto& e : routed.refused) {
        e.reply(Status(static_cast<StatusCode>(h.code), message), Payload{});
      }
      const bool found = routed.found;
      PendingAnswers::Entry& p = routed.entry;
      if (!found || h.code != 0 || !p.reply) {
        st = reader_->Skip(h.payload_bytes);
        if (!st.ok()) break;
        if (!found) {
          TLOG_WARN << "server " << options_.address << " answered unknown request "
                    << h.request_id << ": " << message;
          if (h.request_id == 0 && h.code != 0) {
            // An error about the stream itself (the server closes after it): fail everything.
            st = Status(static_cast<StatusCode>(h.code), message);
            break;
          }
        } else if (p.reply) {
          p.reply(Status(static_cast<StatusCode>(h.code), message), Payload{});
        }
        continue;
      }
      if (h.payload_bytes == 0) {
        p.reply(Status::Ok(), Payload{});
      } else if (p.out != nullptr && h.payload_bytes == p.out_bytes && !h.packed) {
        OutGuard guard(p.out_mu, p.out_closed);
        st = reader_->Read(p.out, h.payload_bytes, &guard);
        if (!st.ok()) {
          p.reply(UnavailableError("data connection to " + options_.address +
                                   " ended mid-answer: " + st.message()),
                  Payload{});
          break;
        }
        p.reply(Status::Ok(), Payload{nullptr, 0, h.payload_bytes, /*in_place=*/true});
      } else {
        // A packed answer, or an unexpected length (bounded by max_payload_): hand the bytes
        // over; the worker decodes the one and reports the other.
        scratch.resize((h.payload_bytes + sizeof(float) - 1) / sizeof(float));
        st = reader_->Read(scratch.data(), h.payload_bytes);
        if (!st.ok()) break;
        wire::Chunks chunks = {std::span<const uint8_t>(
            reinterpret_cast<const uint8_t*>(scratch.data()), h.payload_bytes)};
        p.reply(Status::Ok(), Payload{&chunks, 0, h.payload_bytes, false, h.packed});
      }
    }
    Break(st);
  }

  // The connection is over: stop the writer, then fail every pending request (after the writer
  // let go of the callers' gradient memory).
  void Break(const Status& cause) {
    std::vector<PendingAnswers::Entry> pending;
    Status st;
    {
      std::unique_lock lock(mu_);
      st = closing_ ? CancelledError("data connection to " + options_.address + " closed")
                    : UnavailableError("data connection to " + options_.address +
                                       " ended: " + cause.ToString());
      broken_ = true;
      broken_status_ = st;
      queue_.clear();
      cv_.notify_all();
      ::shutdown(fd_, SHUT_RDWR);
      cv_.wait(lock, [this] { return !writing_; });
      pending = pending_.TakeAll();
    }
    for (auto& p : pending) p.reply(st, Payload{});
  }

  void WriteLoop() {
    std::vector<Frame> batch;
    std::vector<iovec> iov;
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return broken_ || (!writing_ && !queue_.empty()); });
      if (broken_) return;
      batch.clear();
      while (!queue_.empty() && batch.size() < kMaxBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      writing_ = true;
      lock.unlock();
      iov.clear();
      for (auto& f : batch) {
        iov.push_back({f.head, sizeof f.head});
        if (f.payload_bytes > 0) {
          iov.push_back({const_cast<void*>(f.payload), static_cast<size_t>(f.payload_bytes)});
        }
        for (auto& e : f.entries) {
          iov.push_back({e.head, sizeof e.head});
          if (e.payload_bytes > 0) {
            iov.push_back({const_cast<void*>(e.payload), static_cast<size_t>(e.payload_bytes)});
          }
        }
      }
      iovec* at = iov.data();
      int count = static_cast<int>(iov.size());
      tcpwire::SkipSent(batch.front().skip, &at, &count);
      Status st = tcpwire::SendAll(fd_, tls_.get(), at, count);
      if (st.ok()) {
        for (auto& f : batch) {
          if (f.sent) f.sent();
        }
      }
      lock.lock();
      writing_ = false;
      cv_.notify_all();
      if (!st.ok()) {
        // The reader sees the shut-down socket and fails what is pending.
        ::shutdown(fd_, SHUT_RDWR);
        return;
      }
    }
  }

  const ConnectionOptions options_;
  const int fd_;
  std::unique_ptr<TlsStream> tls_;                 // nullptr: plaintext; used by both threads
  std::unique_ptr<tcpwire::SocketReader> reader_;  // used by the reader thread only
  const uint64_t max_payload_;
  std::unique_ptr<v1::DataService::Stub> control_;  // InstallShardMap (FinishDeclarations)
  std::thread read_thread_;
  std::thread write_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  PendingAnswers pending_;                         // GUARDED_BY(mu_)
  std::deque<Frame> queue_;                        // GUARDED_BY(mu_): not yet written
  bool writing_ = false;                           // GUARDED_BY(mu_): a sendmsg in progress
  bool broken_ = false;                            // GUARDED_BY(mu_)
  bool closing_ = false;                           // GUARDED_BY(mu_): destructor started
  Status broken_status_;                           // GUARDED_BY(mu_)
};

}  // namespace

StatusOr<std::unique_ptr<ServerConnection>> ConnectTcp(const ConnectionOptions& o) {
  if (o.tcp_port <= 0) {
    return InvalidArgumentError("server " + o.address +
                                " advertised no TCP data port (expected an address like "
                                "host:port;tcp=P; is it an older trellis-pserver or started with "
                                "--tcp-port=-1?)");
  }
  TRELLIS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(o.address));
  const std::string where = hp.host + ":" + std::to_string(o.tcp_port);
  TRELLIS_ASSIGN_OR_RETURN(int fd, tcpwire::Connect(hp.host, o.tcp_port, o.timeout_ms));
  // Handshake, bounded by the timeout: (mutual TLS,) hello out, the server's verdict back.
  std::unique_ptr<TlsStream> tls;
  std::unique_ptr<tcpwire::SocketReader> reader;
  auto fail = [&](Status st) {
    reader.reset();
    tls.reset();
    ::close(fd);
    return st.Annotate("TCP data connection to " + where);
  };
  if (o.tls) {
    auto stream = TlsStream::Handshake(*o.tls->client_ctx, fd, o.timeout_ms);
    if (!stream.ok()) return fail(stream.status());
    tls = std::move(*stream);
    tls->set_read_timeout_ms(o.timeout_ms);
  }
  SetRecvTimeout(fd, o.timeout_ms);
  reader = std::make_unique<tcpwire::SocketReader>(fd, 64 << 10, tls.get());
  std::vector<uint8_t> hello = tcpwire::EncodeHello(o.token, o.worker_rank);
  iovec iov{hello.data(), hello.size()};
  if (Status st = tcpwire::SendAll(fd, tls.get(), &iov, 1); !st.ok()) return fail(st);
  uint8_t head[wire::kResponseHeaderBytes];
  if (Status st = reader->Read(head, sizeof head); !st.ok()) {
    return fail(UnavailableError("no handshake answer: " + st.message()));
  }
  wire::ResponseHeader h;
  if (Status st = tcpwire::DecodeResponseHeader(head, 0, &h); !st.ok()) return fail(st);
  std::string message(h.message_bytes, '\0');
  if (h.message_bytes > 0) {
    if (Status st = reader->Read(message.data(), message.size()); !st.ok()) return fail(st);
  }
  if (h.code != 0) {
    return fail(Status(static_cast<StatusCode>(h.code), "server refused: " + message));
  }
  SetRecvTimeout(fd, 0);
  if (tls) tls->set_read_timeout_ms(0);
  return std::unique_ptr<ServerConnection>(
      new TcpConnection(o, fd, std::move(tls), std::move(reader)));
}

wire::RequestHeader HeaderOf(const SliceRequest& r) {
  wire::RequestHeader h;
  h.op = r.op;
  h.key = r.key;
  h.slice = r.slice;
  h.step = r.step;
  h.priority = r.priority;
  h.payload_bytes = PayloadBytes(r);
  return h;
}

StatusOr<ConnectFn> TransportByName(const std::string& name) {
  if (name == "grpc") return ConnectFn{ConnectGrpc};
  if (name == "tcp") return ConnectFn{ConnectTcp};
  return InvalidArgumentError("unknown transport '" + name + "': want grpc or tcp");
}

}  // namespace trellis
