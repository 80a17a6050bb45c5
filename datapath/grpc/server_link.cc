// The server's side of the gRPC link; see server_link.h.
#include "datapath/grpc/server_link.h"

#include <charconv>
#include <queue>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/tls/auth.h"
#include "common/base/by_priority.h"
#include "common/base/grpc_status.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "datapath/grpc/frame.h"

namespace trellis::link {
namespace {

using Reactor = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

StreamHello HelloOf(const grpc::CallbackServerContext* ctx) {
  StreamHello hello;
  hello.peer = ctx->peer();
  hello.token = ClientMetadata(*ctx, kTokenMetadataKey);
  hello.rank_text = ClientMetadata(*ctx, wire::kRankMetadataKey);
  const std::string& r = hello.rank_text;
  int32_t rank = -1;
  auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
  if (!r.empty() && ec == std::errc() && p == r.data() + r.size()) hello.rank = rank;
  return hello;
}

void ReleaseAnswer(void* arg) { delete static_cast<AnswerFrame*>(arg); }

// An answer waiting for its turn on the stream.
using Outgoing = ByPriority<grpc::ByteBuffer>;

// The stream's state, which outlives its reactor: answers to waiting pulls may come after the
// worker went away, and request frames not served yet hold it.
struct StreamState final : AnswerSink {
  std::shared_ptr<RequestReceiver> receiver;  // set before the first read
  ReadAheadLimit limit;
  grpc::ByteBuffer in;  // the reactor's read buffer: one read outstanding at a time

  Mutex mu;
  Reactor* reactor GUARDED_BY(mu) = nullptr;  // nullptr once the call is done
  std::priority_queue<Outgoing> out GUARDED_BY(mu);
  grpc::ByteBuffer current GUARDED_BY(mu);  // the write outstanding
  // Bytes of the answers in `out` and `current`: past the read-ahead's byte limit no next read
  // starts, so a worker that stops reading its answers holds back its own requests.
  size_t unsent_bytes GUARDED_BY(mu) = 0;
  uint64_t seq GUARDED_BY(mu) = 0;
  bool writing GUARDED_BY(mu) = false;  // one write outstanding at a time
  bool reads_done GUARDED_BY(mu) = false;
  bool finished GUARDED_BY(mu) = false;  // Finish called, no more writes
  ReadAhead unserved GUARDED_BY(mu);     // requests read and not let go of yet
  bool read_waits GUARDED_BY(mu) = false;  // a next read is due once there is room

  void Send(AnswerFrame a) override EXCLUDES(mu) {
    const int32_t priority = a.priority;
    // Released by gRPC once sent (at once when there is no payload: MakeFrame copies the head).
    auto* keep = new AnswerFrame(std::move(a));
    grpc::ByteBuffer frame = wire::MakeFrame(keep->head.data(), keep->head.size(), {},
                                             keep->PayloadData(), keep->PayloadBytes(),
                                             ReleaseAnswer, keep);
    MutexLock lock(&mu);
    if (finished || reactor == nullptr) return;  // the worker is gone
    unsent_bytes += frame.Length();
    out.push(Outgoing{priority, seq++, std::move(frame)});
    StartNextWriteLocked();
  }

  void StartNextWriteLocked() REQUIRES(mu) {
    if (writing || finished || reactor == nullptr || out.empty()) return;
    writing = true;
    current = std::move(const_cast<Outgoing&>(out.top()).value);
    out.pop();
    reactor->StartWrite(&current);
  }
  // The reactor's next read: now, or once a request is let go of or answers are sent.
  void NextReadLocked() REQUIRES(mu) {
    if (finished || reads_done || reactor == nullptr) return;
    if (!unserved.Fits(limit, 0) || unsent_bytes > limit.bytes) {
      read_waits = true;
      return;
    }
    read_waits = false;
    reactor->StartRead(&in);
  }
  void MaybeFinishLocked() REQUIRES(mu) {
    if (reads_done && !writing && !finished && reactor != nullptr) {
      finished = true;
      while (!out.empty()) out.pop();
      reactor->Finish(grpc::Status::OK);
    }
  }
};

// A request frame's bytes as gRPC received them, and its place in its stream's read-ahead, given
// back when the receiver lets go of it.
class HeldFrame {
 public:
  HeldFrame(std::shared_ptr<StreamState> s, std::vector<grpc::Slice> slices, size_t bytes)
      : stream_(std::move(s)), slices_(std::move(slices)), bytes_(bytes) {
    MutexLock lock(&stream_->mu);
    ++stream_->unserved.requests;
    stream_->unserved.bytes += bytes_;
  }
  ~HeldFrame() {
    MutexLock lock(&stream_->mu);
    --stream_->unserved.requests;
    stream_->unserved.bytes -= bytes_;
    if (stream_->read_waits) stream_->NextReadLocked();
  }
  HeldFrame(const HeldFrame&) = delete;
  HeldFrame& operator=(const HeldFrame&) = delete;

 private:
  const std::shared_ptr<StreamState> stream_;
  const std::vector<grpc::Slice> slices_;  // what the frame's chunks point into
  const size_t bytes_;
};

class StreamReactor final : public Reactor {
 public:
  StreamReactor(grpc::CallbackServerContext* ctx, const AdmitStream& admit,
                const GrpcServerLinkOptions& options)
      : state_(std::make_shared<StreamState>()) {
    const StreamHello hello = HelloOf(ctx);
    StatusOr<std::shared_ptr<RequestReceiver>> receiver = admit(hello, state_);
    if (!receiver.ok()) {
      TLOG_WARN << "refusing data stream from " << hello.peer << ": "
                << receiver.status().ToString();
      // The state never gets a reactor: answers sent to it are dropped.
      Finish(ToGrpc(receiver.status()));
      return;
    }
    state_->receiver = std::move(*receiver);
    state_->limit = options.read_ahead;
    MutexLock lock(&state_->mu);
    state_->reactor = this;
    state_->NextReadLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      MutexLock lock(&state_->mu);
      state_->reads_done = true;
      state_->MaybeFinishLocked();
      return;
    }
    std::vector<grpc::Slice> slices;
    (void)state_->in.Dump(&slices);
    state_->in.Clear();
    RequestFrame frame;
    // Views into the slices' bytes, which stay where they are when the vector moves below.
    frame.chunks = wire::ChunksOf(slices);
    uint64_t id = 0;
    Status st = wire::DecodeRequest(frame.chunks, &frame.header, &id);
    if (!st.ok()) {
      state_->Send(AnswerFrame::Error(wire::Op::kPush, id, st));
    } else {
      frame.hold = std::make_shared<HeldFrame>(state_, std::move(slices),
                                               wire::TotalBytes(frame.chunks));
      // Never served on this gRPC thread whatever its size: the stream's reads wait on it.
      state_->receiver->OnRequest(std::move(frame), /*nothing_behind=*/false);
    }
    MutexLock lock(&state_->mu);
    state_->NextReadLocked();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&state_->mu);
    state_->writing = false;
    state_->unsent_bytes -= state_->current.Length();
    state_->current.Clear();
    if (!ok) {  // the stream is broken (the worker is gone): drop what is queued
      state_->reads_done = true;
      while (!state_->out.empty()) state_->out.pop();
      state_->unsent_bytes = 0;
    }
    if (state_->read_waits) state_->NextReadLocked();
    state_->StartNextWriteLocked();
    state_->MaybeFinishLocked();
  }

  void OnDone() override {
    {
      MutexLock lock(&state_->mu);
      state_->reactor = nullptr;
      state_->finished = true;
    }
    delete this;
  }

 private:
  const std::shared_ptr<StreamState> state_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AcceptGrpcStream(
    grpc::CallbackServerContext* ctx, const AdmitStream& admit,
    const GrpcServerLinkOptions& options) {
  return new StreamReactor(ctx, admit, options);
}

}  // namespace trellis::link
