// The worker's gRPC link (datapath/grpc/worker_link.h) against a hand-driven gRPC server (a
// generic bidi stream): the same link contract as tcp/worker_link_test (link.h). Frames arrive
// as written, with the job token and rank as metadata; answers come back in arrival order with
// their payloads where the receiver puts them; OnClosed runs exactly once; a 2-bit frame is let
// go of.
#include "datapath/grpc/worker_link.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include "common/tls/auth.h"
#include "datapath/grpc/frame.h"
#include "tests/testing/test_frames.h"
#include "tests/unit/datapath/grpc/worker_link_fixture.h"

namespace trellis::link {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "job-token";

// One server with one stream at a time: records each request frame's bytes, writes answers when
// the test says so, ends the stream when told.
class HandGrpcServer final : public grpc::CallbackGenericService {
 public:
  HandGrpcServer() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterCallbackGenericService(this);
    server_ = b.BuildAndStart();
  }
  ~HandGrpcServer() override { server_->Shutdown(std::chrono::system_clock::now() + 5s); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    auto* s = new Stream(this);
    std::lock_guard lock(mu_);
    method_ = ctx->method();
    for (const auto& [k, v] : ctx->client_metadata()) {
      metadata_[std::string(k.data(), k.size())] = std::string(v.data(), v.size());
    }
    stream_ = s;
    cv_.notify_all();
    return s;
  }

  // The next request frame's bytes (header + payload), waiting up to 10 s.
  std::vector<uint8_t> NextFrame() {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, 10s, [&] { return !frames_.empty(); }));
    if (frames_.empty()) return {};
    auto f = std::move(frames_.front());
    frames_.pop_front();
    return f;
  }
  void Answer(uint64_t id, const std::vector<float>& payload) {
    auto bytes = testing::ResponseBytes(id, payload);
    WithStream([&](Stream* s) { s->Send(std::move(bytes)); });
  }
  void End(const grpc::Status& status) {
    WithStream([&](Stream* s) { s->End(status); });
  }
  std::string Metadata(const std::string& key) {
    std::lock_guard lock(mu_);
    return metadata_.count(key) ? metadata_[key] : "";
  }
  std::string method() {
    std::lock_guard lock(mu_);
    return method_;
  }

 private:
  class Stream final : public grpc::ServerGenericBidiReactor {
   public:
    explicit Stream(HandGrpcServer* owner) : owner_(owner) { StartRead(&in_); }
    void OnReadDone(bool ok) override {
      if (!ok) {  // the client went away: a server reactor ends only through Finish
        End(grpc::Status::CANCELLED);
        return;
      }
      std::vector<grpc::Slice> slices;
      (void)in_.Dump(&slices);
      std::vector<uint8_t> bytes;
      for (const auto& s : slices) bytes.insert(bytes.end(), s.begin(), s.end());
      in_.Clear();
      owner_->Received(std::move(bytes));
      StartRead(&in_);
    }
    void Send(std::vector<uint8_t> bytes) {
      std::lock_guard lock(mu_);
      out_.push_back(std::move(bytes));
      NextWriteLocked();
    }
    void OnWriteDone(bool ok) override {
      std::lock_guard lock(mu_);
      writing_ = false;
      out_.pop_front();
      if (ok) NextWriteLocked();
    }
    void OnCancel() override { End(grpc::Status::CANCELLED); }
    void OnDone() override {
      owner_->Gone(this);
      delete this;
    }
    void End(const grpc::Status& status) {
      {
        std::lock_guard lock(mu_);
        if (finished_) return;
        finished_ = true;
      }
      Finish(status);
    }

   private:
    void NextWriteLocked() {
      if (writing_ || out_.empty()) return;
      writing_ = true;
      grpc::Slice slice(out_.front().data(), out_.front().size());
      current_ = grpc::ByteBuffer(&slice, 1);
      StartWrite(&current_);
    }
    HandGrpcServer* const owner_;
    grpc::ByteBuffer in_;
    std::mutex mu_;
    std::deque<std::vector<uint8_t>> out_;  // GUARDED_BY(mu_)
    grpc::ByteBuffer current_;              // GUARDED_BY(mu_)
    bool writing_ = false;                  // GUARDED_BY(mu_)
    bool finished_ = false;                 // GUARDED_BY(mu_)
  };

  void Received(std::vector<uint8_t> bytes) {
    std::lock_guard lock(mu_);
    frames_.push_back(std::move(bytes));
    cv_.notify_all();
  }
  void Gone(Stream* s) {
    std::lock_guard lock(mu_);
    if (stream_ == s) stream_ = nullptr;
  }
  // Runs `fn` on the open stream, outside the lock (gRPC may call back into Gone).
  template <typename Fn>
  void WithStream(Fn fn) {
    Stream* s = nullptr;
    {
      std::unique_lock lock(mu_);
      ASSERT_TRUE(cv_.wait_for(lock, 10s, [&] { return stream_ != nullptr; }));
      s = stream_;
    }
    fn(s);
  }

  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable cv_;
  Stream* stream_ = nullptr;                    // GUARDED_BY(mu_): until its OnDone
  std::deque<std::vector<uint8_t>> frames_;     // GUARDED_BY(mu_)
  std::map<std::string, std::string> metadata_;  // GUARDED_BY(mu_)
  std::string method_;                          // GUARDED_BY(mu_)
};

std::unique_ptr<WorkerLink> StartedLink(const HandGrpcServer& server, Recorder& rec) {
  return StartedGrpcLink(server.address(), kToken, rec);
}

class GrpcLinkTest : public ::testing::TestWithParam<bool> {};  // param: read with View()

TEST_P(GrpcLinkTest, FramesArriveAsWrittenAndAnswersComeBackInArrivalOrder) {
  HandGrpcServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  rec.view = GetParam();
  auto l = StartedLink(server, rec);
  ASSERT_TRUE(l);
  std::atomic<int> sent{0};
  // A request, and a bulk of two entries one of which is a 2-bit frame the link must hold
  // until sent and then let go of.
  const std::vector<float> small = {1, 2, 3, 4}, entry = {5, 6};
  auto encoded = std::make_shared<const std::vector<uint8_t>>(std::vector<uint8_t>(24, 0xab));
  OutFrame a;
  a.first = PartOf(11, small.data(), small.size() * sizeof(float));
  a.sent = [&] { sent.fetch_add(1); };
  OutFrame bulk;
  bulk.first = PartOf(12, nullptr, 0);
  bulk.entries.push_back(PartOf(13, entry.data(), entry.size() * sizeof(float)));
  bulk.entries.push_back(PartOf(14, encoded->data(), encoded->size()));
  bulk.entries.back().encoded = encoded;
  bulk.sent = [&] { sent.fetch_add(1); };
  const auto want_a = BytesOf(a), want_bulk = BytesOf(bulk);
  l->Write(std::move(a));
  l->Write(std::move(bulk));
  EXPECT_EQ(server.NextFrame(), want_a);
  EXPECT_EQ(server.NextFrame(), want_bulk);
  EXPECT_EQ(server.method(), wire::kStreamMethod);
  EXPECT_EQ(server.Metadata(kTokenMetadataKey), kToken);
  EXPECT_EQ(server.Metadata(wire::kRankMetadataKey), "1");

  server.Answer(13, {7, 8});
  server.Answer(11, std::vector<float>(256 << 10, 0.25f));  // 1 MiB
  auto answers = rec.WaitAnswers(2);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].first, 13u);
  EXPECT_EQ(answers[0].second, (std::vector<float>{7, 8}));
  EXPECT_EQ(answers[1].first, 11u);
  EXPECT_EQ(answers[1].second, std::vector<float>(256 << 10, 0.25f));
  EXPECT_EQ(WaitSent(sent, 2), 2);
  EXPECT_EQ(rec.closed(), 0);
  l.reset();
  EXPECT_EQ(rec.closed(), 1);
  EXPECT_EQ(rec.WaitClosed().code(), StatusCode::kCancelled);
  EXPECT_EQ(encoded.use_count(), 1) << "the link still holds the 2-bit frame";
}

INSTANTIATE_TEST_SUITE_P(ReadIntoOrView, GrpcLinkTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "View" : "ReadInto"; });

TEST(GrpcLink, AServerThatEndsTheStreamEndsTheLinkOnceAndLaterFramesAreDropped) {
  HandGrpcServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec);
  ASSERT_TRUE(l);
  server.End(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong job token"));
  const Status st = rec.WaitClosed();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("wrong job token"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("data stream to " + server.address()), std::string::npos)
      << st.ToString();
  std::atomic<int> sent{0};
  const std::vector<float> payload = {1, 2};
  OutFrame f;
  f.first = PartOf(1, payload.data(), payload.size() * sizeof(float));
  f.sent = [&] { sent.fetch_add(1); };
  l->Write(std::move(f));
  l.reset();
  EXPECT_EQ(sent.load(), 0);
  EXPECT_EQ(rec.closed(), 1);
}

TEST(GrpcLink, AnEmptyAddressIsAClearError) {
  LinkOptions o;
  auto l = ConnectGrpcLink(o, nullptr);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trellis::link
