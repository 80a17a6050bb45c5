#include "bench/pushpull/grpc_echo.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "bench_echo.grpc.pb.h"
#include "common/base/grpc_status.h"

namespace trellis::bench {
namespace {

using trellis::bench::v1::BenchEcho;
using trellis::bench::v1::Blob;

constexpr auto kCallDeadline = std::chrono::seconds(30);

// Echoes each message it reads, one at a time, until the client half-closes.
class StreamEchoReactor : public grpc::ServerBidiReactor<Blob, Blob> {
 public:
  StreamEchoReactor() { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&message_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
      return;
    }
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  Blob message_;  // reused for each read and its echo; only one operation is outstanding
};

class EchoService final : public BenchEcho::CallbackService {
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const Blob* request,
                                  Blob* response) override {
    response->set_data(request->data());
    auto* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<Blob, Blob>* Stream(grpc::CallbackServerContext*) override {
    return new StreamEchoReactor();
  }
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace

struct GrpcEchoServer::Impl {
  EchoService service;
  std::unique_ptr<grpc::Server> server;
};

GrpcEchoServer::GrpcEchoServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

GrpcEchoServer::~GrpcEchoServer() {
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  impl_->server->Wait();
}

StatusOr<std::unique_ptr<GrpcEchoServer>> GrpcEchoServer::Start() {
  auto impl = std::make_unique<Impl>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    return UnavailableError("bench echo server failed to start on 127.0.0.1:0");
  }
  const std::string address = "127.0.0.1:" + std::to_string(port);
  return std::unique_ptr<GrpcEchoServer>(new GrpcEchoServer(std::move(impl), address));
}

StatusOr<LatencyResult> MeasureGrpcUnary(const std::string& address, uint64_t bytes,
                                         const Budget& budget) {
  auto stub = BenchEcho::NewStub(MakeChannel(address));
  Blob request;
  request.set_data(std::string(bytes, 'x'));
  StatusOr<RunResult> run = RunBounded(budget, [&]() -> Status {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    Blob response;
    grpc::Status s = stub->Unary(&context, request, &response);
    if (!s.ok()) return FromGrpc(s);
    if (response.data().size() != bytes) return DataLossError("unary echo returned a wrong size");
    return Status::Ok();
  });
  if (!run.ok()) return run.status();
  return LatencyResult{run->latencies.Percentile(50), run->latencies.Percentile(99), run->iters};
}

StatusOr<StreamResult> MeasureGrpcStream(const std::string& address, uint64_t message_bytes,
                                         const Budget& budget) {
  auto stub = BenchEcho::NewStub(MakeChannel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  auto stream = stub->Stream(&context);
  Blob request;
  request.set_data(std::string(message_bytes, 'x'));
  Blob response;
  StatusOr<RunResult> run = RunBounded(budget, [&]() -> Status {
    if (!stream->Write(request)) return UnavailableError("bench stream write failed");
    if (!stream->Read(&response)) return UnavailableError("bench stream read failed");
    if (response.data().size() != message_bytes) return DataLossError("stream echo returned a wrong size");
    return Status::Ok();
  });
  stream->WritesDone();
  grpc::Status finish = stream->Finish();
  if (!run.ok()) return run.status();
  if (!finish.ok()) return FromGrpc(finish);
  return StreamResult{static_cast<double>(message_bytes) * run->iters / run->seconds / 1e9, run->iters};
}

}  // namespace trellis::bench
