#include "datapath/tcp/server_link.h"

#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <optional>
#include <queue>
#include <system_error>
#include <thread>
#include <vector>

#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "datapath/payload_buffers.h"
#include "datapath/tcp/wire.h"

namespace trellis::link {
namespace {

// An answer waiting for its turn on the socket.
struct Outgoing {
  AnswerFrame frame;
  uint64_t seq = 0;
  size_t Bytes() const { return frame.Bytes(); }
  void AppendTo(std::vector<iovec>* iov) const {
    iov->push_back({const_cast<uint8_t*>(frame.head.data()), frame.head.size()});
    if (frame.PayloadBytes() > 0) {
      iov->push_back({const_cast<void*>(frame.PayloadData()), frame.PayloadBytes()});
    }
  }
  bool operator<(const Outgoing& o) const {  // max-heap: higher priority, then FIFO
    return frame.priority != o.frame.priority ? frame.priority < o.frame.priority : seq > o.seq;
  }
};

constexpr size_t kMaxBatch = 16;  // frames per sendmsg
// Bytes per sendmsg: once a batch is handed to the kernel its order is fixed, so a batch stays
// small enough that a higher-priority answer queued meanwhile waits at most about this much.
constexpr size_t kMaxBatchBytes = 1 << 20;
constexpr size_t kSpareBuffers = 2;  // payload buffers a connection keeps for reuse

struct TcpConnection final : TcpServerLink, std::enable_shared_from_this<TcpConnection> {
  TcpConnection(int f, std::unique_ptr<TlsStream> t, TcpServerLinkOptions o)
      : fd(f), options(std::move(o)), tls(std::move(t)) {}
  ~TcpConnection() override {
    tls.reset();
    if (!fd_closed) ::close(fd);
  }

  const int fd;
  const TcpServerLinkOptions options;  // its peer and worker name it in log lines
  std::unique_ptr<TlsStream> tls;  // set before the threads start; nullptr: plaintext
  // Takes what the reader reads; answers come back through Send. Set before the threads start.
  std::shared_ptr<RequestReceiver> receiver;
  std::thread reader;
  std::thread writer;
  std::atomic<int> running{0};  // threads that have not ended

  Mutex mu;
  CondVar cv;  // the writer: work; CloseFd: a send ended; the reader: answer room
  std::priority_queue<Outgoing> out GUARDED_BY(mu);
  uint64_t seq GUARDED_BY(mu) = 0;
  // An answer the serving thread began to send and the socket did not take whole; the writer
  // sends its rest before anything else.
  std::optional<Outgoing> partial GUARDED_BY(mu);
  size_t partial_sent GUARDED_BY(mu) = 0;  // its bytes already sent
  bool writing GUARDED_BY(mu) = false;     // a send on `fd` is in progress
  // Answer bytes queued or partly sent. Past the read-ahead's byte limit the reader reads no
  // more requests until the worker reads its answers: a worker that keeps sending but stops
  // reading is held back by its own socket, not by the server's memory.
  size_t unsent_bytes GUARDED_BY(mu) = 0;
  bool closing GUARDED_BY(mu) = false;    // flush what is queued, then close
  bool dead GUARDED_BY(mu) = false;       // nothing more is written
  bool fd_closed GUARDED_BY(mu) = false;  // `fd` is closed (both threads ended)

  // What the reader has handed to the serving queue and is not served yet. The reader reads
  // ahead only within this budget, so a peer that sends faster than the server serves is held
  // back by its own socket (TCP flow control), not by the server's memory.
  Mutex serve_mu;
  CondVar room;  // the reader: room in the budget, or at its end none left unserved
  ReadAhead unserved GUARDED_BY(serve_mu);  // frames and their bytes
  bool stop_reading GUARDED_BY(serve_mu) = false;  // Kill()
  PayloadBuffers spare GUARDED_BY(serve_mu) = PayloadBuffers(kSpareBuffers);  // to reuse

  // Queues an answer by priority. When nothing is queued or being sent, the calling (serving)
  // thread sends it itself, as far as the socket takes it without waiting: one wake-up fewer
  // per answer, and a worker that stopped reading costs this thread nothing (the writer sends
  // the rest). Through TLS the writer always sends.
  void Send(AnswerFrame answer) override EXCLUDES(mu) {
    Outgoing o{std::move(answer)};
    MutexLock lock(&mu);
    if (closing || dead) return;  // the worker is gone or the stream is being closed
    if (tls || writing || partial || !out.empty()) {
      o.seq = seq++;
      unsent_bytes += o.Bytes();
      out.push(std::move(o));
      lock.Unlock();
      cv.SignalAll();
      return;
    }
    writing = true;
    lock.Unlock();
    std::vector<iovec> iov;
    o.AppendTo(&iov);
    size_t sent = 0;
    Status st = tcpwire::SendNow(fd, iov.data(), static_cast<int>(iov.size()), &sent);
    lock.Lock();
    writing = false;
    if (!st.ok()) {
      dead = true;  // the worker is gone; the writer ends the stream
    } else if (sent < o.Bytes()) {
      unsent_bytes += o.Bytes() - sent;
      partial = std::move(o);
      partial_sent = sent;
    }
    lock.Unlock();
    cv.SignalAll();  // the writer (the rest, or what queued meanwhile), CloseFd
  }
  // A connection whose threads could not all start: the verdict straight from the admission
  // thread (a few bytes into a fresh socket's buffer do not wait; a writer that did start has
  // nothing queued), then the writer, if any, ends the stream.
  void Refuse(const Status& why) {
    std::vector<uint8_t> frame = wire::EncodeStatusFrame(static_cast<wire::Op>(0), 0, why);
    iovec iov{frame.data(), frame.size()};
    if (tls) {
      (void)tls->WriteAll(&iov, 1);
    } else {
      (void)!send(fd, frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    CloseAfterFlush();
  }
  void CloseAfterFlush() EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      closing = true;
    }
    cv.SignalAll();
  }
  void Kill() override EXCLUDES(mu, serve_mu) {
    {
      MutexLock lock(&mu);
      if (!fd_closed) ::shutdown(fd, SHUT_RDWR);
      dead = true;
    }
    cv.SignalAll();
    {
      MutexLock lock(&serve_mu);
      stop_reading = true;
    }
    room.SignalAll();
  }
  // Closes the descriptor at once (not when the link is joined).
  void CloseFd() EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (fd_closed) return;
    // A serving thread's send (never blocking) ends before the descriptor may be reused.
    while (writing) cv.Wait(&mu);
    tls.reset();
    ::close(fd);
    fd_closed = true;
  }
  // Each thread's last act: the last one closes the descriptor and has the connection reaped.
  void ThreadEnded() {
    if (running.fetch_sub(1) != 1) return;
    CloseFd();
    if (options.on_closed) options.on_closed();
  }

  struct Request;
  // Waits until a request of `bytes` fits the read-ahead budget and counts it; a payload buffer
  // of `floats` elements (reused when one is spare). False once the connection is killed.
  bool Reserve(size_t bytes, size_t floats, std::vector<float>* buffer) EXCLUDES(serve_mu);
  void Unreserve(size_t bytes, std::vector<float> buffer) EXCLUDES(serve_mu);

  // Waits until the answers not yet sent fit the read-ahead's byte limit; false once nothing
  // more will be written (killed, or the writer ended).
  bool WaitForAnswerRoom() EXCLUDES(mu) {
    const size_t limit = options.read_ahead.bytes;
    MutexLock lock(&mu);
    while (!dead && !closing && unsent_bytes > limit) cv.Wait(&mu);
    return !dead && !closing;
  }
  void ReadLoop() EXCLUDES(mu, serve_mu);
  void WriteLoop() EXCLUDES(mu);

  bool Start(std::shared_ptr<RequestReceiver> r) override;
  bool Ended() const override { return running.load() == 0; }
  void Join() override {
    if (reader.joinable()) reader.join();
    if (writer.joinable()) writer.join();
  }
};

// One frame read from the socket, waiting in the serving queue (a bulk: until its last entry is
// served). Its end gives its place in the read-ahead budget and its buffer back.
struct TcpConnection::Request {
  Request(std::shared_ptr<TcpConnection> c, size_t bytes) : conn(std::move(c)), budget(bytes) {}
  ~Request() { conn->Unreserve(budget, std::move(payload)); }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  wire::Chunks Chunks() const {
    return {std::span<const uint8_t>(head, sizeof head),
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(payload.data()),
                                     header.payload_bytes)};
  }

  const std::shared_ptr<TcpConnection> conn;
  const size_t budget;
  uint8_t head[wire::kRequestHeaderBytes];
  wire::RequestHeader header;
  std::vector<float> payload;  // at least the payload, in whole floats (a reused buffer)
};

bool TcpConnection::Reserve(size_t bytes, size_t floats, std::vector<float>* buffer) {
  const ReadAheadLimit& limit = options.read_ahead;
  MutexLock lock(&serve_mu);
  while (!stop_reading && !unserved.Fits(limit, bytes)) room.Wait(&serve_mu);
  if (stop_reading) return false;
  ++unserved.requests;
  unserved.bytes += bytes;
  *buffer = spare.Take(floats);
  lock.Unlock();
  PayloadBuffers::Grow(buffer, floats);  // never shrunk: see payload_buffers.h
  return true;
}

void TcpConnection::Unreserve(size_t bytes, std::vector<float> buffer) {
  {
    MutexLock lock(&serve_mu);
    --unserved.requests;
    unserved.bytes -= bytes;
    spare.Give(std::move(buffer));
  }
  room.SignalAll();  // the reader waits for room, or at its end for none left
}

void TcpConnection::ReadLoop() {
  tcpwire::SocketReader rd(fd, 64 << 10, tls.get());
  Send(AnswerFrame::Error(static_cast<wire::Op>(0), 0, Status::Ok()));  // the hello's: welcome
  Status st;
  const uint64_t max_payload = options.max_payload;
  while (true) {
    if (!WaitForAnswerRoom()) break;  // the stream is ending
    uint8_t head[wire::kRequestHeaderBytes];
    st = rd.Read(head, sizeof head);
    if (!st.ok()) break;  // the worker went away (or Stop)
    wire::RequestHeader h;
    st = tcpwire::DecodeRequestHeader(head, max_payload, &h);
    if (!st.ok()) {
      TLOG_WARN << "data connection from " << options.peer << " (worker " << options.worker
                << "): " << st.ToString();
      uint64_t id;
      std::memcpy(&id, head + 8, sizeof id);
      Send(AnswerFrame::Error(wire::Op::kPush, id, st));
      break;
    }
    // Rounded up: a 2-bit frame need not be a whole number of floats.
    const size_t n = (h.payload_bytes + sizeof(float) - 1) / sizeof(float);
    const size_t bytes = sizeof head + h.payload_bytes;
    std::vector<float> buffer;
    if (!Reserve(bytes, n, &buffer)) break;  // Stop
    auto r = std::make_shared<Request>(shared_from_this(), bytes);  // Unreserve()s at its end
    r->payload = std::move(buffer);
    std::memcpy(r->head, head, sizeof head);
    r->header = h;
    if (h.payload_bytes > 0) {
      st = rd.Read(r->payload.data(), h.payload_bytes);
      if (!st.ok()) break;  // truncated frame: the peer closed mid-payload
    }
    RequestFrame frame{h, r->Chunks(), r};
    // The store may take the payload (a first push) and leave a buffer of the same size.
    if (h.op != wire::Op::kBulk && h.payload_bytes == n * sizeof(float) && r->payload.size() == n) {
      frame.floats = &r->payload;
    }
    // Nothing more arrived: no request of this worker to read ahead or to let overtake this
    // one, so the reader may serve it whatever its size rather than wake the pool.
    receiver->OnRequest(std::move(frame), rd.NothingWaiting());
  }
  {
    // What was read is still answered before the stream closes (as when it was served inline).
    MutexLock lock(&serve_mu);
    while (!stop_reading && unserved.requests != 0) room.Wait(&serve_mu);
  }
  CloseAfterFlush();
}

void TcpConnection::WriteLoop() {
  MutexLock lock(&mu);
  std::vector<Outgoing> batch;
  std::vector<iovec> iov;
  while (true) {
    while (!dead && (writing || (!closing && !partial && out.empty()))) cv.Wait(&mu);
    if (dead || (!partial && out.empty())) break;  // killed, or closing with everything flushed
    batch.clear();
    iov.clear();
    size_t skip = 0;         // bytes of the batch's first answer a serving thread already sent
    size_t batch_bytes = 0;  // what this send writes
    if (partial) {
      skip = partial_sent;
      batch_bytes = partial->Bytes() - skip;
      batch.push_back(std::move(*partial));
      partial.reset();
    }
    while (!out.empty() && batch.size() < kMaxBatch && batch_bytes < kMaxBatchBytes) {
      batch.push_back(std::move(const_cast<Outgoing&>(out.top())));
      out.pop();
      batch_bytes += batch.back().Bytes();
    }
    writing = true;
    lock.Unlock();
    for (auto& o : batch) o.AppendTo(&iov);
    iovec* at = iov.data();
    int count = static_cast<int>(iov.size());
    tcpwire::SkipSent(skip, &at, &count);
    Status st = tcpwire::SendAll(fd, tls.get(), at, count);
    batch.clear();  // releases the result buffers
    lock.Lock();
    writing = false;
    unsent_bytes -= batch_bytes;
    cv.SignalAll();  // CloseFd may wait for the send to end, the reader for answer room
    if (!st.ok()) break;  // the worker is gone
  }
  dead = true;
  while (!out.empty()) out.pop();
  partial.reset();
  unsent_bytes = 0;
  lock.Unlock();
  cv.SignalAll();  // a reader waiting for answer room
  // Ends the byte stream after the last answer (the worker reads an error frame, then EOF) and
  // wakes the reader if it still waits.
  ::shutdown(fd, SHUT_RDWR);
}

bool TcpConnection::Start(std::shared_ptr<RequestReceiver> r) {
  receiver = std::move(r);
  // The writer first, so that whatever the reader queues (the hello's answer first) is sent.
  struct Thread {
    std::thread* thread;
    const char* name;
    void (TcpConnection::*loop)();
  };
  running = 2;
  int started = 0;
  for (const Thread& t : {Thread{&writer, "pserver-tcp-wr", &TcpConnection::WriteLoop},
                          Thread{&reader, "pserver-tcp-rd", &TcpConnection::ReadLoop}}) {
    try {
      // Raw: the owner keeps the link until Join (a thread must not free its own std::thread).
      *t.thread = std::thread([this, t] {
        pthread_setname_np(pthread_self(), t.name);
        (this->*t.loop)();
        ThreadEnded();
      });
      ++started;
    } catch (const std::system_error& e) {
      TLOG_WARN << "refusing data connection from " << options.peer << " (worker "
                << options.worker << "): no thread for it: " << e.what();
      Refuse(UnavailableError(
          "the parameter server cannot start a thread for this connection now; try again"));
      // The shares of the threads that did not start: the last thread's end (or this, when none
      // started) closes the descriptor.
      for (int i = started; i < 2; ++i) ThreadEnded();
      return false;
    }
  }
  return true;
}

}  // namespace

std::shared_ptr<TcpServerLink> TcpServerLink::Create(int fd, std::unique_ptr<TlsStream> tls,
                                                     TcpServerLinkOptions options) {
  return std::make_shared<TcpConnection>(fd, std::move(tls), std::move(options));
}

}  // namespace trellis::link
