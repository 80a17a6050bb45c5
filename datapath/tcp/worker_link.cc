// The worker's link over raw TCP; see worker_link.h.
#include "datapath/tcp/worker_link.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <deque>
#include <thread>

#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "common/base/net.h"
#include "datapath/tcp/wire.h"

namespace trellis::link {
namespace {

constexpr size_t kMaxBatch = 32;  // frames per sendmsg
// Payloads the caller's thread may send itself (Write's inline send): up to 1 MiB, a copy of
// ~0.1-0.3 ms. Bigger ones (whole 4 MiB slices) go to the writer thread so that a training
// script's backward pass, which queues gradients as they are computed, does not spend its own
// time copying them into the kernel while a core may be free to do it.
constexpr uint64_t kInlineSendMaxBytes = 1 << 20;

void SetRecvTimeout(int fd, int64_t ms) {
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

// An answer's payload, still in the socket.
class SocketPayload final : public AnswerPayload {
 public:
  SocketPayload(tcpwire::SocketReader* reader, uint64_t bytes, std::vector<float>* scratch)
      : reader_(reader), bytes_(bytes), scratch_(scratch) {}
  uint64_t bytes() const override { return bytes_; }
  Status ReadInto(void* dst, WriteGuard* guard) override {
    if (read_) return FailedPreconditionError("answer payload read twice");
    read_ = true;
    status_ = reader_->Read(dst, bytes_, guard);
    return status_;
  }
  StatusOr<wire::Chunks> View() override {
    if (read_) return FailedPreconditionError("answer payload read twice");
    read_ = true;
    scratch_->resize((bytes_ + sizeof(float) - 1) / sizeof(float));
    status_ = reader_->Read(scratch_->data(), bytes_);
    if (!status_.ok()) return status_;
    return wire::Chunks{
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(scratch_->data()), bytes_)};
  }
  // After OnAnswer: skips what was not read. An error means the stream is lost.
  Status Finish() {
    if (!read_) return reader_->Skip(bytes_);
    return status_;
  }

 private:
  tcpwire::SocketReader* const reader_;
  const uint64_t bytes_;
  std::vector<float>* const scratch_;  // packed answers and answers read whole
  bool read_ = false;
  Status status_;
};

class TcpLink final : public WorkerLink {
 public:
  TcpLink(const LinkOptions& o, int fd, std::unique_ptr<TlsStream> tls,
          std::unique_ptr<tcpwire::SocketReader> rd)
      : options_(o), fd_(fd), tls_(std::move(tls)), reader_(std::move(rd)) {}

  ~TcpLink() override {
    {
      MutexLock lock(&mu_);
      closing_ = true;
    }
    ::shutdown(fd_, SHUT_RDWR);  // wakes both threads; the reader ends the link
    if (read_thread_.joinable()) read_thread_.join();
    if (write_thread_.joinable()) write_thread_.join();
    reader_.reset();
    tls_.reset();
    ::close(fd_);
  }

  void Start(LinkReceiver* receiver) override {
    receiver_ = receiver;
    read_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "trellis-tcp-rd");
      ReadLoop();
    });
    write_thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "trellis-tcp-wr");
      WriteLoop();
    });
  }

  void Write(OutFrame f) override EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    if (broken_) return;  // the receiver fails it (OnClosed)
    if (tls_ == nullptr && !writing_ && queue_.empty() && f.entries.empty() &&
        f.first.payload_bytes <= kInlineSendMaxBytes) {
      writing_ = true;
      lock.Unlock();
      SendInline(std::move(f));
      return;
    }
    queue_.push_back(Queued{std::move(f), 0});
    lock.Unlock();
    cv_.SignalAll();
  }

 private:
  struct Queued {
    OutFrame frame;
    size_t skip = 0;  // bytes the caller's thread already sent (SendInline)
  };

  // The caller's thread sends a frame when nothing is queued or being written (one wake-up of the
  // writer fewer per request), as far as the socket takes it without waiting; the writer sends
  // the rest. `sent` then runs here, after the lock is let go.
  // Write set writing_ for it.
  void SendInline(OutFrame f) EXCLUDES(mu_) {
    const Part& p = f.first;
    iovec iov[2] = {{const_cast<uint8_t*>(p.head), sizeof p.head},
                    {const_cast<void*>(p.payload), p.payload_bytes}};
    size_t sent = 0;
    Status st = tcpwire::SendNow(fd_, iov, p.payload_bytes > 0 ? 2 : 1, &sent);
    std::function<void()> done;
    MutexLock lock(&mu_);
    writing_ = false;
    if (!st.ok()) {
      ::shutdown(fd_, SHUT_RDWR);  // the reader ends the link
    } else if (sent < sizeof p.head + p.payload_bytes) {
      queue_.push_front(Queued{std::move(f), sent});
    } else {
      done = std::move(f.sent);
    }
    lock.Unlock();
    cv_.SignalAll();  // the writer (the rest, or what queued meanwhile), Break
    if (done) done();
  }

  void ReadLoop() {
    Status st;
    std::string message;
    std::vector<float> scratch;
    while (true) {
      uint8_t head[wire::kResponseHeaderBytes];
      st = reader_->Read(head, sizeof head);
      if (!st.ok()) break;
      wire::ResponseHeader h;
      st = tcpwire::DecodeResponseHeader(head, options_.max_answer_payload, &h);
      if (!st.ok()) break;
      message.resize(h.message_bytes);
      if (h.message_bytes > 0) {
        st = reader_->Read(message.data(), h.message_bytes);
        if (!st.ok()) break;
      }
      if (h.request_id == 0 && h.code != 0) {
        // An error about the stream itself (the server closes after it).
        st = Status(static_cast<StatusCode>(h.code), message);
        break;
      }
      SocketPayload payload(reader_.get(), h.payload_bytes, &scratch);
      receiver_->OnAnswer(h, message, payload);
      st = payload.Finish();
      if (!st.ok()) break;
    }
    Break(st);
  }

  // The link is over: stop the writer, then tell the receiver (after the writer let go of the
  // callers' memory).
  void Break(const Status& cause) {
    Status st;
    {
      MutexLock lock(&mu_);
      st = closing_ ? CancelledError("data connection to " + options_.address.service + " closed")
                    : UnavailableError("data connection to " + options_.address.service +
                                       " ended: " + cause.ToString());
      broken_ = true;
      queue_.clear();
      cv_.SignalAll();
      ::shutdown(fd_, SHUT_RDWR);
      while (writing_) cv_.Wait(&mu_);
    }
    receiver_->OnClosed(st);
  }

  void WriteLoop() {
    std::vector<Queued> batch;
    std::vector<iovec> iov;
    MutexLock lock(&mu_);
    while (true) {
      while (!broken_ && (writing_ || queue_.empty())) cv_.Wait(&mu_);
      if (broken_) return;
      batch.clear();
      while (!queue_.empty() && batch.size() < kMaxBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      writing_ = true;
      lock.Unlock();
      iov.clear();
      auto add = [&iov](const Part& p) {
        iov.push_back({const_cast<uint8_t*>(p.head), sizeof p.head});
        if (p.payload_bytes > 0) {
          iov.push_back({const_cast<void*>(p.payload), static_cast<size_t>(p.payload_bytes)});
        }
      };
      for (auto& q : batch) {
        add(q.frame.first);
        for (auto& e : q.frame.entries) add(e);
      }
      iovec* at = iov.data();
      int count = static_cast<int>(iov.size());
      tcpwire::SkipSent(batch.front().skip, &at, &count);
      Status st = tcpwire::SendAll(fd_, tls_.get(), at, count);
      if (st.ok()) {
        for (auto& q : batch) {
          if (q.frame.sent) q.frame.sent();
        }
      }
      batch.clear();  // drops the 2-bit frames' references before the writer may be waited for
      lock.Lock();
      writing_ = false;
      cv_.SignalAll();
      if (!st.ok()) {
        // The reader sees the shut-down socket and ends the link.
        ::shutdown(fd_, SHUT_RDWR);
        return;
      }
    }
  }

  const LinkOptions options_;
  const int fd_;
  std::unique_ptr<TlsStream> tls_;                 // nullptr: plaintext; used by both threads
  std::unique_ptr<tcpwire::SocketReader> reader_;  // used by the reader thread only
  LinkReceiver* receiver_ = nullptr;               // set by Start, before the threads
  std::thread read_thread_;
  std::thread write_thread_;

  Mutex mu_;
  CondVar cv_;  // the writer: work, or broken; Break: the writer stopped writing
  std::deque<Queued> queue_ GUARDED_BY(mu_);  // not yet written
  bool writing_ GUARDED_BY(mu_) = false;      // a sendmsg in progress
  bool broken_ GUARDED_BY(mu_) = false;
  bool closing_ GUARDED_BY(mu_) = false;      // destructor started
};

}  // namespace

StatusOr<std::unique_ptr<WorkerLink>> ConnectTcpLink(const LinkOptions& o) {
  const DataAddress& a = o.address;
  if (a.tcp_port <= 0) {
    return InvalidArgumentError("server " + a.service +
                                " advertised no TCP data port (expected an address like "
                                "host:port;tcp=P; is it an older trellis-pserver or started with "
                                "--tcp-port=-1?)");
  }
  TRELLIS_ASSIGN_OR_RETURN(HostPort hp, ParseHostPort(a.service));
  std::string where = hp.host + ":" + std::to_string(a.tcp_port);
  int fd = -1;
  if (o.use_local_socket && !a.local_name.empty()) {
    // The server's local socket answers only within its own network namespace; from another
    // host or pod the connect fails at once and TCP follows.
    if (auto local = tcpwire::ConnectLocal(a.local_name); local.ok()) {
      fd = *local;
      where += " (local socket)";
      TLOG_INFO << "data connection to " << a.service << " over its local socket";
    } else {
      TLOG_INFO << "data connection to " << a.service << ": " << local.status().message()
                << "; over TCP";
    }
  }
  if (fd < 0) {
    TRELLIS_ASSIGN_OR_RETURN(fd, tcpwire::Connect(hp.host, a.tcp_port, o.timeout_ms));
  }
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
  return std::unique_ptr<WorkerLink>(new TcpLink(o, fd, std::move(tls), std::move(reader)));
}

}  // namespace trellis::link
