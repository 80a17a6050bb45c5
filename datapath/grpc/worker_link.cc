// The worker's link over gRPC; see worker_link.h.
#include "datapath/grpc/worker_link.h"

#include <deque>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "common/tls/auth.h"
#include "common/base/grpc_status.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"
#include "datapath/grpc/frame.h"

namespace trellis::link {
namespace {

void NoRelease(void*) {}

// A compressed push's frame, referenced by the gRPC slice that carries it.
using EncodedRef = std::shared_ptr<const std::vector<uint8_t>>;
void ReleaseEncoded(void* ref) { delete static_cast<EncodedRef*>(ref); }

// An answer's payload: bytes of the message gRPC already received.
class SlicePayload final : public AnswerPayload {
 public:
  SlicePayload(const wire::Chunks& chunks, size_t offset, uint64_t bytes)
      : chunks_(chunks), offset_(offset), bytes_(bytes) {}
  uint64_t bytes() const override { return bytes_; }
  Status ReadInto(void* dst, WriteGuard* guard) override {
    if (guard != nullptr && !guard->Begin()) return Status::Ok();  // dropped, as TCP's does
    wire::CopyOut(chunks_, offset_, bytes_, dst);
    if (guard != nullptr) guard->End();
    return Status::Ok();
  }
  StatusOr<wire::Chunks> View() override { return wire::SubChunks(chunks_, offset_, bytes_); }

 private:
  const wire::Chunks& chunks_;
  const size_t offset_;
  const uint64_t bytes_;
};

class GrpcLink final : public WorkerLink,
                       public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  GrpcLink(const LinkOptions& o, std::shared_ptr<grpc::Channel> channel)
      : options_(o), channel_(std::move(channel)), stub_(std::make_unique<grpc::GenericStub>(channel_)) {
    if (!o.token.empty()) ctx_.AddMetadata(kTokenMetadataKey, o.token);
    ctx_.AddMetadata(wire::kRankMetadataKey, std::to_string(o.worker_rank));
    ctx_.set_wait_for_ready(true);
  }

  ~GrpcLink() override {
    if (!started_) return;
    ctx_.TryCancel();
    MutexLock lock(&mu_);
    while (!done_) done_cv_.Wait(&mu_);
  }

  void Start(LinkReceiver* receiver) override {
    receiver_ = receiver;
    started_ = true;
    stub_->PrepareBidiStreamingCall(&ctx_, wire::kStreamMethod, grpc::StubOptions(), this);
    StartRead(&in_);
    StartCall();
  }

  void Write(OutFrame f) override EXCLUDES(mu_) {
    // Headers are copied into the message; payloads are referenced (sent without a copy).
    std::vector<grpc::Slice> slices;
    slices.reserve(2 + 2 * f.entries.size());
    auto add = [&slices](const Part& p) {
      slices.emplace_back(p.head, sizeof p.head);
      if (p.payload_bytes == 0) return;
      if (p.encoded) {
        // gRPC releases the slice when it no longer needs the bytes; until then this reference
        // keeps the 2-bit frame alive.
        slices.emplace_back(const_cast<void*>(p.payload), p.payload_bytes, ReleaseEncoded,
                            new EncodedRef(p.encoded));
      } else {
        slices.emplace_back(const_cast<void*>(p.payload), p.payload_bytes, NoRelease, nullptr);
      }
    };
    MutexLock lock(&mu_);
    if (broken_) return;  // the receiver fails it (OnClosed)
    add(f.first);
    for (const auto& e : f.entries) add(e);
    writes_.push_back({grpc::ByteBuffer(slices.data(), slices.size()), std::move(f.sent)});
    StartNextWriteLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows with the status
    std::vector<grpc::Slice> slices;
    (void)in_.Dump(&slices);
    in_.Clear();
    wire::Chunks chunks = wire::ChunksOf(slices);
    wire::ResponseHeader h;
    std::string message;
    Status st = wire::DecodeResponse(chunks, &h, &message);
    if (!st.ok()) {
      TLOG_WARN << "server " << options_.address.service << ": " << st.ToString();
    } else {
      SlicePayload payload(chunks, wire::kResponseHeaderBytes + h.message_bytes, h.payload_bytes);
      receiver_->OnAnswer(h, message, payload);
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::function<void()> sent;
    {
      MutexLock lock(&mu_);
      writing_ = false;
      current_.Clear();
      sent = std::move(current_sent_);
      current_sent_ = nullptr;
      if (!ok) return;  // the stream is failing; OnDone ends the link
      StartNextWriteLocked();
    }
    if (sent) sent();
  }

  void OnDone(const grpc::Status& s) override {
    Status st;
    {
      MutexLock lock(&mu_);
      Status cause = FromGrpc(s);
      if (cause.ok()) cause = UnavailableError("stream closed by the server");
      st = Status(cause.code() == StatusCode::kCancelled ? StatusCode::kCancelled
                                                         : StatusCode::kUnavailable,
                  "data stream to " + options_.address.service + " ended: " + cause.ToString());
      broken_ = true;
      writes_.clear();
    }
    receiver_->OnClosed(st);
    MutexLock lock(&mu_);
    done_ = true;
    done_cv_.SignalAll();
  }

 private:
  void StartNextWriteLocked() REQUIRES(mu_) {
    if (writing_ || writes_.empty() || broken_) return;
    writing_ = true;
    current_ = std::move(writes_.front().frame);
    current_sent_ = std::move(writes_.front().sent);
    writes_.pop_front();
    StartWrite(&current_);
  }

  const LinkOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;  // owned by the read in progress
  LinkReceiver* receiver_ = nullptr;  // set by Start
  bool started_ = false;              // set by Start

  Mutex mu_;
  CondVar done_cv_;  // OnDone ran
  struct QueuedWrite {
    grpc::ByteBuffer frame;
    std::function<void()> sent;  // may be empty
  };
  std::deque<QueuedWrite> writes_ GUARDED_BY(mu_);
  grpc::ByteBuffer current_ GUARDED_BY(mu_);  // the write in flight
  std::function<void()> current_sent_ GUARDED_BY(mu_);
  bool writing_ GUARDED_BY(mu_) = false;
  bool broken_ GUARDED_BY(mu_) = false;
  bool done_ GUARDED_BY(mu_) = false;  // OnDone ran
};

}  // namespace

StatusOr<std::unique_ptr<WorkerLink>> ConnectGrpcLink(const LinkOptions& o,
                                                      std::shared_ptr<grpc::Channel>* channel) {
  if (o.address.service.empty()) return InvalidArgumentError("empty server address");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(o.max_answer_payload));
  args.SetMaxSendMessageSize(-1);
  wire::ApplyDataChannelArgs([&](const char* name, int value) { args.SetInt(name, value); });
  // Own TCP connection per worker-server pair, even for several workers in one process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto ch = grpc::CreateCustomChannel(o.address.service, ChannelCredentials(o.tls, &args), args);
  if (channel != nullptr) *channel = ch;
  return std::unique_ptr<WorkerLink>(new GrpcLink(o, std::move(ch)));
}

}  // namespace trellis::link
