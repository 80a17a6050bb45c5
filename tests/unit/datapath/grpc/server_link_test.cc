// The server's gRPC link (datapath/grpc/server_link.h) under a generic gRPC service, with the
// worker's gRPC link (worker_link.h) as its peer: the server's side of the link contract (link.h).
// The stream's metadata reaches admission; a refused stream ends the worker's link with the
// reason; request frames reach the receiver whole; answers and errors reach the worker; bytes that
// do not parse are answered under their id while the stream goes on; what the receiver holds
// bounds the reads; the stream lets go of itself once the worker is gone.
#include "datapath/grpc/server_link.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "common/tls/auth.h"
#include "datapath/grpc/frame.h"
#include "tests/unit/datapath/grpc/worker_link_fixture.h"

namespace trellis::link {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "job-token";

// Keeps every request frame it receives (and so the frame's place in the read-ahead) until the
// test lets go of it; answers through the stream's sink when told.
class FrameKeeper final : public RequestReceiver {
 public:
  struct Kept {
    wire::RequestHeader header;
    std::vector<uint8_t> bytes;
    std::shared_ptr<void> hold;
  };

  void OnRequest(RequestFrame frame, bool) override {
    Kept k{frame.header, {}, std::move(frame.hold)};
    for (const auto& c : frame.chunks) k.bytes.insert(k.bytes.end(), c.begin(), c.end());
    std::lock_guard lock(mu_);
    kept_.push_back(std::move(k));
    cv_.notify_all();
  }

  // Waits up to `wait` for `n` frames received in all; how many there are.
  size_t WaitFrames(size_t n, std::chrono::milliseconds wait = 10s) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [&] { return kept_.size() >= n; });
    return kept_.size();
  }
  Kept Frame(size_t i) {
    std::lock_guard lock(mu_);
    return {kept_.at(i).header, kept_.at(i).bytes, nullptr};
  }
  void LetGo(size_t i) {
    std::shared_ptr<void> hold;
    {
      std::lock_guard lock(mu_);
      hold = std::move(kept_.at(i).hold);
    }
  }
  void LetGoOfAll() {
    std::lock_guard lock(mu_);
    for (auto& k : kept_) k.hold.reset();
  }

  std::weak_ptr<AnswerSink> sink;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Kept> kept_;  // GUARDED_BY(mu_)
};

// A gRPC server whose every stream is a server link admitted by `admit`.
class LinkServer final : public grpc::CallbackGenericService {
 public:
  LinkServer(AdmitStream admit, GrpcServerLinkOptions options)
      : admit_(std::move(admit)), options_(options) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(this);
    server_ = b.BuildAndStart();
  }
  ~LinkServer() override { server_->Shutdown(std::chrono::system_clock::now() + 5s); }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return AcceptGrpcStream(ctx, admit_, options_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const AdmitStream admit_;
  const GrpcServerLinkOptions options_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Admits every stream to `keeper`, recording the hello.
AdmitStream AdmitTo(const std::shared_ptr<FrameKeeper>& keeper, StreamHello* hello) {
  return [keeper, hello](const StreamHello& h, std::shared_ptr<AnswerSink> sink)
             -> StatusOr<std::shared_ptr<RequestReceiver>> {
    *hello = h;
    keeper->sink = sink;
    return std::shared_ptr<RequestReceiver>(keeper);
  };
}

GrpcServerLinkOptions Options(size_t requests) {
  GrpcServerLinkOptions o;
  o.read_ahead.requests = requests;
  o.read_ahead.bytes = 64 << 20;
  return o;
}

// A server link admitting to `keeper`, and a worker's link to it.
class GrpcServerLinkTest : public ::testing::Test {
 protected:
  void Connect(size_t read_ahead_requests = 16) {
    server = std::make_unique<LinkServer>(AdmitTo(keeper, &hello), Options(read_ahead_requests));
    worker = StartedGrpcLink(server->address(), kToken, rec);
    ASSERT_TRUE(worker);
  }

  const std::shared_ptr<FrameKeeper> keeper = std::make_shared<FrameKeeper>();
  StreamHello hello;
  std::unique_ptr<LinkServer> server;
  Recorder rec;  // outlives the worker's link, which reports to it
  std::unique_ptr<WorkerLink> worker;
};

OutFrame FrameOf(uint64_t id, const std::vector<float>& payload) {
  OutFrame f;
  f.first = PartOf(id, payload.data(), payload.size() * sizeof(float));
  return f;
}

TEST_F(GrpcServerLinkTest, FramesArriveWholeAndAnswersAndErrorsReachTheWorker) {
  ASSERT_NO_FATAL_FAILURE(Connect());

  // A request, and a bulk whose one entry follows its header (the bulk's payload).
  const std::vector<float> a = {1, 2, 3}, entry = {4, 5};
  OutFrame bulk;
  wire::RequestHeader bh;
  bh.op = wire::Op::kBulk;
  bh.request_id = 21;
  bh.payload_bytes = wire::kRequestHeaderBytes + entry.size() * sizeof(float);
  wire::EncodeRequestHeader(bh, bulk.first.head);
  bulk.entries.push_back(PartOf(22, entry.data(), entry.size() * sizeof(float)));
  OutFrame first = FrameOf(20, a);
  const auto want_first = BytesOf(first), want_bulk = BytesOf(bulk);
  worker->Write(std::move(first));
  worker->Write(std::move(bulk));

  ASSERT_EQ(keeper->WaitFrames(2), 2u);
  EXPECT_EQ(hello.token, kToken);
  EXPECT_EQ(hello.rank, 1);
  EXPECT_EQ(hello.rank_text, "1");
  EXPECT_EQ(keeper->Frame(0).header.request_id, 20u);
  EXPECT_EQ(keeper->Frame(0).bytes, want_first);
  EXPECT_EQ(keeper->Frame(1).header.op, wire::Op::kBulk);
  EXPECT_EQ(keeper->Frame(1).bytes, want_bulk);

  auto sink = keeper->sink.lock();
  ASSERT_TRUE(sink);
  AnswerFrame answer;
  wire::ResponseHeader rh;
  rh.op = wire::Op::kPushPull;
  rh.request_id = 20;
  rh.payload_bytes = 3 * sizeof(float);
  answer.head.resize(wire::kResponseHeaderBytes);
  wire::EncodeResponseHeader(rh, answer.head.data());
  answer.values = std::make_shared<const std::vector<float>>(std::vector<float>{7, 8, 9});
  sink->Send(std::move(answer));
  sink->Send(AnswerFrame::Error(wire::Op::kPushPull, 22, NotFoundError("no key 9")));
  sink.reset();
  auto answers = rec.WaitAnswers(2);
  ASSERT_EQ(answers.size(), 2u);
  // Both may queue behind one write: the error (highest priority) may overtake.
  const size_t ok_at = answers[0].first == 20u ? 0 : 1;
  EXPECT_EQ(answers[ok_at].first, 20u);
  EXPECT_EQ(answers[ok_at].second, (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(answers[1 - ok_at].first, 22u);
  const auto [code, message] = rec.Verdict(1 - ok_at);
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kNotFound));
  EXPECT_EQ(message, "no key 9");
  EXPECT_EQ(rec.closed(), 0);
}

TEST(GrpcServerLink, ARefusedStreamEndsTheWorkersLinkWithTheReason) {
  auto admit = [](const StreamHello&, std::shared_ptr<AnswerSink>)
      -> StatusOr<std::shared_ptr<RequestReceiver>> {
    return UnauthenticatedError("wrong job token");
  };
  LinkServer server(admit, Options(16));
  Recorder rec;
  auto worker = StartedGrpcLink(server.address(), kToken, rec);
  ASSERT_TRUE(worker);
  const Status st = rec.WaitClosed();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("wrong job token"), std::string::npos) << st.ToString();
}

TEST_F(GrpcServerLinkTest, BytesThatDoNotParseAreAnsweredUnderTheirIdAndTheStreamGoesOn) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // A header announcing 64 payload bytes followed by 8: the frame is short.
  const std::vector<float> two = {1, 2};
  OutFrame bad = FrameOf(31, two);
  wire::RequestHeader h;
  h.op = wire::Op::kPushPull;
  h.request_id = 31;
  h.payload_bytes = 64;
  wire::EncodeRequestHeader(h, bad.first.head);
  worker->Write(std::move(bad));
  worker->Write(FrameOf(32, two));

  ASSERT_EQ(keeper->WaitFrames(1), 1u);
  EXPECT_EQ(keeper->Frame(0).header.request_id, 32u);
  auto answers = rec.WaitAnswers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].first, 31u);
  const auto [code, message] = rec.Verdict(0);
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(message.find("malformed"), std::string::npos) << message;
  EXPECT_EQ(keeper->WaitFrames(2, 200ms), 1u) << "the bad frame reached the receiver";
  EXPECT_EQ(rec.closed(), 0);
}

TEST_F(GrpcServerLinkTest, WhatTheReceiverHoldsBoundsTheReads) {
  ASSERT_NO_FATAL_FAILURE(Connect(2));
  const std::vector<float> payload(1024, 1.0f);
  for (uint64_t id = 1; id <= 4; ++id) worker->Write(FrameOf(id, payload));

  ASSERT_EQ(keeper->WaitFrames(2), 2u);
  EXPECT_EQ(keeper->WaitFrames(3, 300ms), 2u) << "read past the read-ahead of 2 requests";
  keeper->LetGo(0);
  ASSERT_EQ(keeper->WaitFrames(3), 3u);
  EXPECT_EQ(keeper->Frame(2).header.request_id, 3u);
  EXPECT_EQ(keeper->WaitFrames(4, 300ms), 3u);
  keeper->LetGoOfAll();
  ASSERT_EQ(keeper->WaitFrames(4), 4u);
  EXPECT_EQ(keeper->Frame(3).header.request_id, 4u);
}

TEST_F(GrpcServerLinkTest, TheStreamLetsGoOfItselfOnceTheWorkerIsGoneAndItsFramesAreLetGoOf) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  const std::vector<float> payload = {1};
  worker->Write(FrameOf(1, payload));
  ASSERT_EQ(keeper->WaitFrames(1), 1u);
  worker.reset();
  // A pull answered after its worker left: the frame it was for still holds the stream.
  EXPECT_FALSE(keeper->sink.expired());
  keeper->LetGoOfAll();
  for (int i = 0; i < 1000 && !keeper->sink.expired(); ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(keeper->sink.expired()) << "the stream outlived its worker and its frames";
}

}  // namespace
}  // namespace trellis::link
