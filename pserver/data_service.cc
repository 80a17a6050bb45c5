#include "pserver/data_service.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <queue>

#include "common/auth.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "datapath/grpc_frame.h"

namespace trellis {
namespace {

std::string Metadata(const grpc::CallbackServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return {};
  return std::string(it->second.data(), it->second.size());
}

void ReleaseValues(void* arg) { delete static_cast<Values*>(arg); }
void ReleasePacked(void* arg) { delete static_cast<Packed*>(arg); }

// An answer waiting for its turn on the stream.
using Outgoing = ByPriority<grpc::ByteBuffer>;

}  // namespace

// What outlives the reactor: answers to waiting pulls may come after the worker went away.
struct DataService::StreamState {
  int32_t worker = 0;
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
  void Send(int32_t priority, grpc::ByteBuffer frame) {
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

// A request's place in its stream's read-ahead, given back when the request is served (or
// dropped unserved at shutdown).
struct DataService::Unserved {
  Unserved(std::shared_ptr<StreamState> s, size_t b) : stream(std::move(s)), bytes(b) {
    std::lock_guard lock(stream->mu);
    ++stream->unserved.requests;
    stream->unserved.bytes += bytes;
  }
  ~Unserved() { stream->Served(bytes); }
  Unserved(const Unserved&) = delete;
  Unserved& operator=(const Unserved&) = delete;
  const std::shared_ptr<StreamState> stream;
  const size_t bytes;
};

namespace {

class StreamReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamReactor(DataService* service, grpc::CallbackServerContext* ctx)
      : service_(service), state_(std::make_shared<DataService::StreamState>()) {
    Status st = service->CheckToken(ctx);
    if (st.ok()) st = ParseRank(ctx);
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
    DataService::Task task;
    task.stream = state_;
    (void)in_.Dump(&task.slices);
    in_.Clear();
    wire::Chunks chunks = wire::ChunksOf(task.slices);
    uint64_t id = 0;
    Status st = wire::DecodeRequest(chunks, &task.header, &id);
    if (!st.ok()) {
      // Garbage cannot be attributed to a pending request beyond its id (0 when unreadable);
      // answer it and keep the stream: gRPC framing keeps the next message intact.
      SendError(state_, id, wire::Op::kPush, st);
    } else if (task.header.op != wire::Op::kBulk) {
      service_->Submit(std::move(task), wire::TotalBytes(chunks));
    } else {
      SubmitBulk(std::move(task), chunks);
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

  // One task per entry, each a view into the same received slices (reference-counted).
  void SubmitBulk(DataService::Task bulk, const wire::Chunks& chunks) {
    std::vector<wire::BulkEntry> entries;
    Status st = wire::ParseBulk(chunks, wire::kRequestHeaderBytes, bulk.header.payload_bytes,
                                &entries);
    if (!st.ok()) {
      TLOG_WARN << "data stream of worker " << state_->worker << ": " << st.ToString();
      SendError(state_, bulk.header.request_id, wire::Op::kBulk, st);
      return;
    }
    for (const auto& e : entries) {
      DataService::Task t;
      t.stream = state_;
      t.header = e.header;
      t.slices = bulk.slices;
      t.offset = e.offset;
      t.bytes = e.bytes;
      service_->Submit(std::move(t), e.header.payload_bytes);
    }
  }

  static void SendError(const std::shared_ptr<DataService::StreamState>& stream, uint64_t id,
                        wire::Op op, const Status& st) {
    wire::ResponseHeader h;
    h.op = op;
    h.request_id = id;
    h.code = static_cast<int32_t>(st.code());
    h.message_bytes = static_cast<uint32_t>(st.message().size());
    uint8_t buf[wire::kResponseHeaderBytes];
    wire::EncodeResponseHeader(h, buf);
    // Errors jump the queue: the worker's handle fails at once.
    stream->Send(INT32_MAX, wire::MakeFrame(buf, sizeof buf, st.message(), nullptr, 0, nullptr,
                                            nullptr));
  }

 private:
  Status ParseRank(grpc::CallbackServerContext* ctx) {
    std::string r = Metadata(ctx, wire::kRankMetadataKey);
    int32_t rank = -1;
    auto [p, ec] = std::from_chars(r.data(), r.data() + r.size(), rank);
    int32_t w = service_->store()->config().num_workers;
    if (r.empty() || ec != std::errc() || p != r.data() + r.size() || rank < 0 || rank >= w) {
      return InvalidArgumentError(std::string("data stream needs metadata ") +
                                  wire::kRankMetadataKey + " = a worker rank in [0, " +
                                  std::to_string(w) + "), got '" + r + "'");
    }
    state_->worker = rank;
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

Status DataService::CheckToken(const grpc::CallbackServerContext* ctx) const {
  if (options_.token.empty()) return Status::Ok();
  std::string got = Metadata(ctx, kTokenMetadataKey);
  if (got.empty()) {
    return UnauthenticatedError(std::string("missing job token (metadata ") + kTokenMetadataKey +
                                ")");
  }
  if (!TokenEquals(options_.token, got)) return UnauthenticatedError("wrong job token");
  return Status::Ok();
}

grpc::ServerUnaryReactor* DataService::InstallShardMap(grpc::CallbackServerContext* ctx,
                                                       const v1::InstallShardMapRequest* req,
                                                       v1::InstallShardMapResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  Status st = CheckToken(ctx);
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

void DataService::Submit(Task task, size_t payload_bytes) {
  const int32_t priority = task.header.priority;
  auto t = std::make_shared<Task>(std::move(task));
  auto place = std::make_shared<Unserved>(t->stream, payload_bytes);
  if (!serving_->Submit(priority, payload_bytes, [this, t, place] { Serve(*t); })) {
    StreamReactor::SendError(t->stream, t->header.request_id, t->header.op,
                             UnavailableError("parameter server shutting down"));
  }
}

void DataService::Serve(Task& task) {
  const wire::RequestHeader h = task.header;
  wire::Chunks chunks = wire::ChunksOf(task.slices);
  if (task.bytes > 0) chunks = wire::SubChunks(chunks, task.offset, task.bytes);  // a bulk entry
  std::shared_ptr<StreamState> stream = task.stream;
  store_->Handle(stream->worker, h, chunks, [stream, h](const Status& st, Answer answer) {
    if (!st.ok()) {
      StreamReactor::SendError(stream, h.request_id, h.op, st);
      return;
    }
    wire::ResponseHeader r;
    r.op = h.op;
    r.request_id = h.request_id;
    r.packed = answer.packed != nullptr;
    r.payload_bytes = r.packed ? answer.packed->size()
                               : (answer.values ? answer.values->size() * sizeof(float) : 0);
    uint8_t buf[wire::kResponseHeaderBytes];
    wire::EncodeResponseHeader(r, buf);
    if (answer.packed) {
      const uint8_t* data = answer.packed->data();
      auto* keep = new Packed(std::move(answer.packed));  // released by gRPC when sent
      stream->Send(h.priority, wire::MakeFrame(buf, sizeof buf, {}, data, r.payload_bytes,
                                               ReleasePacked, keep));
    } else if (answer.values) {
      const float* data = answer.values->data();
      auto* keep = new Values(std::move(answer.values));  // released by gRPC when sent
      stream->Send(h.priority, wire::MakeFrame(buf, sizeof buf, {}, data, r.payload_bytes,
                                               ReleaseValues, keep));
    } else {
      stream->Send(h.priority, wire::MakeFrame(buf, sizeof buf, {}, nullptr, 0, nullptr, nullptr));
    }
  });
  // The request's slices are released here, once summed.
  task.slices.clear();
}

}  // namespace trellis
