#include "pserver/data_service.h"

#include "common/tls/auth.h"
#include "common/base/grpc_status.h"
#include "common/base/logging.h"
#include "datapath/grpc/frame.h"
#include "datapath/grpc/server_link.h"
#include "pserver/front_door.h"

namespace trellis {

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
  Status st = CheckToken(options_.token, ClientMetadata(*ctx, kTokenMetadataKey));
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

grpc::ServerUnaryReactor* DataService::HandOver(grpc::CallbackServerContext* ctx,
                                                const v1::HandOverRequest* req,
                                                v1::HandOverResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  Status st = CheckToken(options_.token, ClientMetadata(*ctx, kTokenMetadataKey));
  const int32_t slots = store_->config().slots();
  if (st.ok() && (req->worker_rank() < 0 || req->worker_rank() >= slots)) {
    st = InvalidArgumentError("handover from worker " + std::to_string(req->worker_rank()) +
                              ": not a worker rank in [0, " + std::to_string(slots) + ")");
  }
  const wire::Chunks frame = {std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(req->frame().data()), req->frame().size())};
  wire::RequestHeader h;
  uint64_t id = 0;
  if (st.ok()) st = wire::DecodeRequest(frame, &h, &id);
  if (st.ok() && !wire::IsHandoverOp(h.op)) {
    st = InvalidArgumentError(std::string("HandOver carries a handout or handin frame, not ") +
                              wire::OpName(h.op));
  }
  if (st.ok()) {
    // Both ops are answered inline (slice_handover.h), so `st` and `resp` are set on return.
    store_->Handle(req->worker_rank(), h, frame, [&st, resp](const Status& s, Answer a) {
      st = s;
      if (s.ok() && a.values) {
        resp->set_payload(reinterpret_cast<const char*>(a.values->data()),
                          a.values->size() * sizeof(float));
      }
    });
  }
  reactor->Finish(ToGrpc(st));
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DataService::Stream(
    grpc::CallbackServerContext* ctx) {
  // The job token and the worker's rank, from the stream's metadata; the stream's front door.
  auto admit = [this](const link::StreamHello& hello, std::shared_ptr<AnswerSink> sink)
      -> StatusOr<std::shared_ptr<link::RequestReceiver>> {
    const int32_t w = store_->config().slots();
    Status st = CheckWorker(options_.token, hello.token, hello.rank, w);
    if (st.code() == StatusCode::kInvalidArgument) {  // the rank: say where it is read from
      st = InvalidArgumentError(std::string("data stream needs metadata ") +
                                wire::kRankMetadataKey + " = a worker rank in [0, " +
                                std::to_string(w) + "), got '" + hello.rank_text + "'");
    }
    if (!st.ok()) return st;
    return std::shared_ptr<link::RequestReceiver>(
        std::make_shared<FrontDoor>(store_, serving_, hello.rank, std::move(sink)));
  };
  return link::AcceptGrpcStream(ctx, admit, link::GrpcServerLinkOptions{options_.read_ahead});
}

}  // namespace trellis
