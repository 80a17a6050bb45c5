#include "pserver/data_service.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <queue>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "datapath/grpc_frame.h"
#include "pserver/front_door.h"

namespace trellis {
namespace {

std::string Metadata(const grpc::CallbackServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return {};
  return std::string(it->second.data(), it->second.size());
}

void ReleaseAnswer(void* arg) { delete static_cast<AnswerFrame*>(arg); }

// An answer waiting for its turn on the stream.
using Outgoing = ByPriority<grpc::ByteBuffer>;

}  // namespace

// What outlives the reactor: answers to waiting pulls may come after the worker went away.
struct DataService::StreamState : AnswerSink {
  std::shared_ptr<FrontDoor> door;  // set before the first read
  std::mutex mu;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* reactor = nullptr;  // GUARDED_BY(mu)
  std::priority_queue<Outgoing> out;  // GUARDED_BY(mu)
  // Bytes of the answers in `out` and `current`: past the read-ahead's byte limit the reactor
  // reads no more requests, so a worker that stops reading its answers holds back its own
  // requests (gRPC flow control) instead of growing `out` without bound.
  size_t unsent_bytes = 0;            // GUARDED_BY(mu)
  uint64_t seq = 0;                   // GUARDED_BY(mu)
  bool writing = false;               // GUARDED_BY(mu): one write outstanding at a time
  bool reads_done = false;            // GUARDED_BY(mu)
  bool finished = false;              // GUARDED_BY(mu): Finish called, no more writes
  // The read-ahead (pserver/serving_queue.h): requests read and not served yet. Past the limit
  // the reactor starts no next read; the request served last starts it.
  ReadAhead unserved;                 // GUARDED_BY(mu)
  bool read_waits = false;            // GUARDED_BY(mu): a next read is due once there is room
  grpc::ByteBuffer* in = nullptr;     // the reactor's read buffer
  ReadAheadLimit limit;

  // REQUIRES: mu held.
  void MaybeFinishLocked() {
    if (reads_done && !writing && !finished && reactor != nullptr) {
      finished = true;
      while (!out.empty()) out.pop();
      reactor->Finish(grpc::Status::OK);
    }
  }
  void StartNextLocked() {
    if (writing || finished || reactor == nullptr || out.empty()) return;
    writing = true;
    // The frame must stay alive until OnWriteDone; keep it in `current`.
    current = std::move(const_cast<Outgoing&>(out.top()).value);
    out.pop();
    reactor->StartWrite(&current);
  }
  void Send(AnswerFrame a) override {
    const int32_t priority = a.priority;
    // The payload is referenced, not copied: the answer is released by gRPC once sent (at once
    // when it has no payload; MakeFrame copies the header).
    auto* keep = new AnswerFrame(std::move(a));
    Queue(priority, wire::MakeFrame(keep->head.data(), keep->head.size(), {}, keep->PayloadData(),
                                    keep->PayloadBytes(), ReleaseAnswer, keep));
  }
  void Queue(int32_t priority, grpc::ByteBuffer frame) {
    std::lock_guard lock(mu);
    if (finished || reactor == nullptr) return;  // the worker is gone
    unsent_bytes += frame.Length();
    out.push(Outgoing{priority, seq++, std::move(frame)});
    StartNextLocked();
  }
  grpc::ByteBuffer current;  // GUARDED_BY(mu) while writing

  // The reactor's next read: now, or once a request is served or answers are sent.
  // REQUIRES: mu held.
  void NextReadLocked() {
    if (finished || reads_done || reactor == nullptr) return;
    if (!unserved.Fits(limit, 0) || unsent_bytes > limit.bytes) {
      read_waits = true;
      return;
    }
    read_waits = false;
    reactor->StartRead(in);
  }
  void Served(size_t bytes) {
    std::lock_guard lock(mu);
    --unserved.requests;
    unserved.bytes -= bytes;
    if (read_waits) NextReadLocked();
  }
};

// A request frame as received: its slices, and its place in its stream's read-ahead, given back
// when the frame is served (or dropped unserved at shutdown).
struct DataService::Received {
  Received(std::shared_ptr<StreamState> s, std::vector<grpc::Slice> sl, size_t b)
      : stream(std::move(s)), slices(std::move(sl)), bytes(b) {
    std::lock_guard lock(stream->mu);
    ++stream->unserved.requests;
    stream->unserved.bytes += bytes;
  }
  ~Received() { stream->Served(bytes); }
  Received(const Received&) = delete;
  Received& operator=(const Received&) = delete;
  const std::shared_ptr<StreamState> stream;
  const std::vector<grpc::Slice> slices;
  const size_t bytes;
};

namespace {

class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(DataService* service, grpc::CallbackServerContext* ctx)
      : service_(service), state_(std::make_shared<DataService::StreamState>()) {
    Status st = Admit(ctx);
    if (!st.ok()) {
      TLOG_WARN << "refusing data stream from " << ctx->peer() << ": " << st.ToString();
      {
        std::lock_guard lock(state_->mu);
        state_->finished = true;
      }
      Finish(ToGrpc(st));
      return;
    }
    std::lock_guard lock(state_->mu);
    state_->reactor = this;
    state_->in = &in_;
    state_->limit = service->read_ahead();
    state_->NextReadLocked();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      std::lock_guard lock(state_->mu);
      state_->reads_done = true;
      state_->MaybeFinishLocked();
      return;
    }
    std::vector<grpc::Slice> slices;
    (void)in_.Dump(&slices);
    in_.Clear();
    RequestFrame frame;
    // Views into the slices' bytes, which stay where they are when the vector moves below.
    frame.chunks = wire::ChunksOf(slices);
    uint64_t id = 0;
    Status st = wire::DecodeRequest(frame.chunks, &frame.header, &id);
    if (!st.ok()) {
      // Garbage cannot be attributed to a pending request beyond its id (0 when unreadable);
      // answer it and keep the stream: gRPC framing keeps the next message intact.
      state_->door->SendError(wire::Op::kPush, id, st);
    } else {
      frame.hold = std::make_shared<DataService::Received>(state_, std::move(slices),
                                                           wire::TotalBytes(frame.chunks));
      state_->door->Receive(std::move(frame));
    }
    std::lock_guard lock(state_->mu);
    state_->NextReadLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard lock(state_->mu);
    state_->writing = false;
    state_->unsent_bytes -= state_->current.Length();
    state_->current.Clear();
    if (!ok) {
      // The stream is broken (worker gone); drop what is queued.
      state_->reads_done = true;
      while (!state_->out.empty()) state_->out.pop();
      state_->unsent_bytes = 0;
    }
    if (state_->read_waits) state_->NextReadLocked();
    state_->StartNextLocked();
    state_->MaybeFinishLocked();
  }

  void OnDone() override {
    {
      std::lock_guard lock(state_->mu);
      state_->reactor = nullptr;
      state_->finished = true;
    }
    delete this;
  }

 private:
  // The job token and the worker's rank, from the stream's metadata; the stream's front door.
  Status Admit(grpc::CallbackServerContext* ctx) {
    const std::string r = Metadata(ctx, wire::kRankMetadataKey);
    int32_t rank = -1;
    auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
    const bool parsed = !r.empty() && ec == std::errc() && p == r.data() + r.size();
    const int32_t w = service_->store()->config().num_workers;
    Status st = CheckWorker(service_->token(), Metadata(ctx, kTokenMetadataKey),
                            parsed ? rank : -1, w);
    if (st.code() == StatusCode::kInvalidArgument) {  // the rank: say where it is read from
      st = InvalidArgumentError(std::string("data stream needs metadata ") +
                                wire::kRankMetadataKey + " = a worker rank in [0, " +
                                std::to_string(w) + "), got '" + r + "'");
    }
    if (!st.ok()) return st;
    state_->door = std::make_shared<FrontDoor>(service_->store(), service_->serving(), rank,
                                               state_);
    return Status::Ok();
  }

  DataService* const service_;
  std::shared_ptr<DataService::StreamState> state_;
  grpc::ByteBuffer in_;
};

}  // namespace

DataService::DataService(SliceStore* store, ServingQueue* serving, DataServiceOptions options)
    : store_(store), serving_(serving), options_(std::move(options)) {}

DataService::~DataService() { Stop(); }

void DataService::Stop() {
  store_->FailWaiters(UnavailableError("parameter server shutting down"));
}

grpc::ServerUnaryReactor* DataService::InstallShardMap(grpc::CallbackServerContext* ctx,
                                                       const v1::InstallShardMapRequest* req,
                                                       v1::InstallShardMapResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  Status st = CheckToken(options_.token, Metadata(ctx, kTokenMetadataKey));
  if (st.ok() && req->server_rank() != store_->config().server_rank) {
    st = InvalidArgumentError("shard map sent to server " + std::to_string(req->server_rank()) +
                              " reached server " + std::to_string(store_->config().server_rank));
  }
  if (st.ok()) {
    int64_t slices = 0;
    int64_t bytes = 0;
    st = store_->Install(req->shard_map(), &slices, &bytes);
    resp->set_slices(slices);
    resp->set_bytes(bytes);
    if (st.ok() && req->worker_rank() == 0) {
      TLOG_INFO << "shard map installed: " << slices << " slices, " << bytes << " bytes";
    }
  }
  reactor->Finish(ToGrpc(st));
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DataService::Stream(
    grpc::CallbackServerContext* ctx) {
  return new StreamReactor(this, ctx);
}

}  // namespace trellis
