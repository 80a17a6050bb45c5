// ServerConnection over gRPC: InstallShardMap is a unary call; slices travel on one raw
// ByteBuffer stream (generic stub + callback reactor). Request frames reference the caller's
// memory (no copy); answers are multiplexed back by request id.
#include <condition_variable>
#include <deque>
#include <mutex>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "datapath/grpc_frame.h"
#include "worker-lib/src/pending_answers.h"
#include "worker-lib/src/transport.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/shard_map_install.h"

namespace trellis {
namespace {

void NoRelease(void*) {}

// A compressed push's frame, referenced by the gRPC slice that carries it.
using EncodedRef = std::shared_ptr<const std::vector<uint8_t>>;
void ReleaseEncoded(void* ref) { delete static_cast<EncodedRef*>(ref); }

class GrpcConnection final : public ServerConnection,
                             public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit GrpcConnection(const ConnectionOptions& o) : options_(o) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(static_cast<int>(wire::MaxMessageBytes(o.slice_bytes)));
    args.SetMaxSendMessageSize(-1);
    wire::ApplyDataChannelArgs([&](const char* name, int value) { args.SetInt(name, value); });
    // Own TCP connection per worker-server pair, even for several workers in one process.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = grpc::CreateCustomChannel(o.address, ChannelCredentials(o.tls, &args), args);
    control_ = v1::DataService::NewStub(channel_);
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    if (!o.token.empty()) ctx_.AddMetadata(kTokenMetadataKey, o.token);
    ctx_.AddMetadata(wire::kRankMetadataKey, std::to_string(o.worker_rank));
    ctx_.set_wait_for_ready(true);
    stub_->PrepareBidiStreamingCall(&ctx_, wire::kStreamMethod, grpc::StubOptions(), this);
    StartRead(&in_);
    StartCall();
  }

  ~GrpcConnection() override {
    ctx_.TryCancel();
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }

  const std::string& address() const override { return options_.address; }

  Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                         int64_t timeout_ms) override {
    return InstallShardMapOnServer(control_.get(), options_, map, server_rank, timeout_ms);
  }

  using ServerConnection::Send;
  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) override {
    wire::RequestHeader h = HeaderOf(r);
    Status dead;
    {
      std::lock_guard lock(mu_);
      if (done_ || broken_) {
        dead = broken_status_;
      } else {
        h.request_id = pending_.Add(r, std::move(reply));
        uint8_t buf[wire::kRequestHeaderBytes];
        wire::EncodeRequestHeader(h, buf);
        if (r.encoded) {
          // gRPC releases the slice when it no longer needs the bytes; until then the frame is
          // kept alive by this reference.
          writes_.push_back({wire::MakeFrame(buf, sizeof buf, {}, PayloadData(r), h.payload_bytes,
                                             ReleaseEncoded, new EncodedRef(r.encoded)),
                             std::move(sent)});
        } else {
          writes_.push_back({wire::MakeFrame(buf, sizeof buf, {}, r.payload, h.payload_bytes,
                                             NoRelease, nullptr),
                             std::move(sent)});
        }
        StartNextWriteLocked();
        return;
      }
    }
    reply(dead, Payload{});
  }

  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) override {
    wire::RequestHeader bulk;
    bulk.op = wire::Op::kBulk;
    bulk.priority = requests.front().priority;
    for (const auto& r : requests) {
      bulk.payload_bytes += wire::kRequestHeaderBytes + HeaderOf(r).payload_bytes;
    }
    Status dead;
    {
      std::lock_guard lock(mu_);
      if (done_ || broken_) {
        dead = broken_status_;
      } else {
        // Headers are copied into the frame; payloads are referenced (sent without a copy).
        std::vector<grpc::Slice> slices;
        slices.reserve(1 + 2 * requests.size());
        uint8_t buf[wire::kRequestHeaderBytes];
        uint64_t first_entry = 0;
        bulk.request_id = pending_.AddBulk(requests, std::move(replies), &first_entry);
        wire::EncodeRequestHeader(bulk, buf);
        slices.emplace_back(buf, sizeof buf);
        for (size_t i = 0; i < requests.size(); ++i) {
          wire::RequestHeader h = HeaderOf(requests[i]);
          h.request_id = first_entry + i;
          wire::EncodeRequestHeader(h, buf);
          slices.emplace_back(buf, sizeof buf);
          if (h.payload_bytes > 0 && requests[i].encoded) {
            // As in Send: the slice's release drops this reference to the 2-bit frame.
            slices.emplace_back(const_cast<void*>(PayloadData(requests[i])), h.payload_bytes,
                                ReleaseEncoded, new EncodedRef(requests[i].encoded));
          } else if (h.payload_bytes > 0) {
            slices.emplace_back(const_cast<float*>(requests[i].payload), h.payload_bytes,
                                NoRelease, nullptr);
          }
        }
        writes_.push_back({grpc::ByteBuffer(slices.data(), slices.size()), std::move(sent)});
        StartNextWriteLocked();
        return;
      }
    }
    for (auto& reply : replies) reply(dead, Payload{});
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
      TLOG_WARN << "server " << options_.address << ": " << st.ToString();
    } else {
      PendingAnswers::Routed routed;
      {
        std::lock_guard lock(mu_);
        routed = pending_.Take(h.request_id, h.code);
      }
      // The entries of a bulk the server refused as a whole.
      for (auto& e : routed.refused) {
        e.reply(Status(static_cast<StatusCode>(h.code), message), Payload{});
      }
      SliceReply& reply = routed.entry.reply;
      if (!routed.refused.empty()) {
        // answered: the bulk's entries failed with its error
      } else if (!reply) {
        TLOG_WARN << "server " << options_.address << " answered unknown request "
                  << h.request_id << ": " << message;
      } else if (h.code != 0) {
        reply(Status(static_cast<StatusCode>(h.code), message), Payload{});
      } else {
        reply(Status::Ok(), Payload{&chunks, wire::kResponseHeaderBytes + h.message_bytes,
                                    static_cast<size_t>(h.payload_bytes), false, h.packed});
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    SliceSent sent;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      current_.Clear();
      sent = std::move(current_sent_);
      current_sent_ = nullptr;
      if (!ok) return;  // the stream is failing; OnDone fails what is pending
      StartNextWriteLocked();
    }
    if (sent) sent();
  }

  void OnDone(const grpc::Status& s) override {
    std::vector<PendingAnswers::Entry> pending;
    Status st;
    {
      std::lock_guard lock(mu_);
      Status cause = FromGrpc(s);
      if (cause.ok()) cause = UnavailableError("stream closed by the server");
      st = Status(cause.code() == StatusCode::kCancelled ? StatusCode::kCancelled
                                                         : StatusCode::kUnavailable,
                  "data stream to " + options_.address + " ended: " + cause.ToString());
      broken_ = true;
      broken_status_ = st;
      pending = pending_.TakeAll();
      writes_.clear();
    }
    for (auto& p : pending) p.reply(st, Payload{});
    std::lock_guard lock(mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  void StartNextWriteLocked() {
    if (writing_ || writes_.empty() || broken_) return;
    writing_ = true;
    current_ = std::move(writes_.front().frame);
    current_sent_ = std::move(writes_.front().sent);
    writes_.pop_front();
    StartWrite(&current_);
  }

  const ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::DataService::Stub> control_;
  std::unique_ptr<grpc::GenericStub> stub_;
  grpc::ClientContext ctx_;
  grpc::ByteBuffer in_;  // owned by the read in progress

  std::mutex mu_;
  std::condition_variable done_cv_;
  PendingAnswers pending_;                            // GUARDED_BY(mu_)
  struct Write {
    grpc::ByteBuffer frame;
    SliceSent sent;  // may be empty
  };
  std::deque<Write> writes_;                          // GUARDED_BY(mu_)
  grpc::ByteBuffer current_;                          // GUARDED_BY(mu_): the write in flight
  SliceSent current_sent_;                            // GUARDED_BY(mu_)
  bool writing_ = false;                              // GUARDED_BY(mu_)
  bool broken_ = false;                               // GUARDED_BY(mu_)
  Status broken_status_;                              // GUARDED_BY(mu_)
  bool done_ = false;                                 // GUARDED_BY(mu_): OnDone ran
};

}  // namespace

StatusOr<std::unique_ptr<ServerConnection>> ConnectGrpc(const ConnectionOptions& options) {
  if (options.address.empty()) return InvalidArgumentError("empty server address");
  return std::unique_ptr<ServerConnection>(new GrpcConnection(options));
}

}  // namespace trellis
