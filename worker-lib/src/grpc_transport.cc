// ServerConnection over gRPC: InstallShardMap is a unary call; slices travel on one raw
// ByteBuffer stream (generic stub + callback reactor). Request frames reference the caller's
// memory (no copy); answers are multiplexed back by request id.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <unordered_map>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "worker-lib/src/transport.h"
#include "trellis/v1/data.grpc.pb.h"
#include "worker-lib/src/shard_map_install.h"

namespace trellis {
namespace {

void NoRelease(void*) {}

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
    channel_ = grpc::CreateCustomChannel(o.address, grpc::InsecureChannelCredentials(), args);
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

  void Send(const SliceRequest& r, SliceReply reply) override {
    wire::RequestHeader h;
    h.op = r.op;
    h.key = r.key;
    h.slice = r.slice;
    h.step = r.step;
    h.priority = r.priority;
    h.payload_bytes = static_cast<uint64_t>(r.payload_elements) * sizeof(float);
    Status dead;
    {
      std::lock_guard lock(mu_);
      if (done_ || broken_) {
        dead = broken_status_;
      } else {
        h.request_id = next_id_++;
        uint8_t buf[wire::kRequestHeaderBytes];
        wire::EncodeRequestHeader(h, buf);
        pending_.emplace(h.request_id, std::move(reply));
        writes_.push_back(wire::MakeFrame(buf, sizeof buf, {}, r.payload, h.payload_bytes,
                                          NoRelease, nullptr));
        StartNextWriteLocked();
        return;
      }
    }
    reply(dead, Payload{});
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
      SliceReply reply;
      {
        std::lock_guard lock(mu_);
        auto it = pending_.find(h.request_id);
        if (it != pending_.end()) {
          reply = std::move(it->second);
          pending_.erase(it);
        }
      }
      if (!reply) {
        TLOG_WARN << "server " << options_.address << " answered unknown request "
                  << h.request_id << ": " << message;
      } else if (h.code != 0) {
        reply(Status(static_cast<StatusCode>(h.code), message), Payload{});
      } else {
        reply(Status::Ok(), Payload{&chunks, wire::kResponseHeaderBytes + h.message_bytes,
                                    static_cast<size_t>(h.payload_bytes)});
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(mu_);
    writing_ = false;
    current_.Clear();
    if (!ok) return;  // the stream is failing; OnDone fails what is pending
    StartNextWriteLocked();
  }

  void OnDone(const grpc::Status& s) override {
    std::unordered_map<uint64_t, SliceReply> pending;
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
      pending.swap(pending_);
      writes_.clear();
    }
    for (auto& [id, reply] : pending) reply(st, Payload{});
    std::lock_guard lock(mu_);
    done_ = true;
    done_cv_.notify_all();
  }

 private:
  void StartNextWriteLocked() {
    if (writing_ || writes_.empty() || broken_) return;
    writing_ = true;
    current_ = std::move(writes_.front());
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
  std::unordered_map<uint64_t, SliceReply> pending_;  // GUARDED_BY(mu_)
  std::deque<grpc::ByteBuffer> writes_;               // GUARDED_BY(mu_)
  grpc::ByteBuffer current_;                          // GUARDED_BY(mu_): the write in flight
  bool writing_ = false;                              // GUARDED_BY(mu_)
  uint64_t next_id_ = 1;                              // GUARDED_BY(mu_): 0 = unattributable
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
