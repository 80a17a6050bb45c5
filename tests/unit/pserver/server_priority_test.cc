// Server-side priority on both transports (issue 17): requests that wait at the parameter
// server are served, and answered, highest priority first, even when the high-priority ones
// arrived after the low-priority ones. The server's serving is held while the client sends
// (ServingQueueTestPeer::Hold), so every request is waiting when it is released; the client
// sends raw frames in a fixed order (the worker's own queue is not involved). Before the
// serving queue was shared, the TCP listener served inline in arrival order.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "tests/testing/test_pserver.h"
#include "tests/unit/pserver/raw_stream.h"
#include "tests/unit/pserver/raw_tcp.h"
#include "tests/unit/pserver/serving_queue_peer.h"
#include "tests/testing/test_frames.h"

namespace trellis {
namespace {

using testing::Answer;
using testing::RequestBytes;

constexpr char kToken[] = "tok";
constexpr int kLow = 40;   // keys 0..39, priority -5, sent first
constexpr int kHigh = 8;   // keys 100..107, priority 7, sent after them
constexpr int kElements = 16;
constexpr uint64_t kLowId = 1000;
constexpr uint64_t kHighId = 2000;

// The low-priority requests (keys 0..39, priority -5), then the high-priority ones (keys
// 100..107, priority 7), one frame each.
std::vector<std::vector<uint8_t>> Lows() {
  std::vector<std::vector<uint8_t>> frames;
  for (int i = 0; i < kLow; ++i) {
    frames.push_back(RequestBytes(wire::Op::kPushPull, i, 0, 1,
                                  std::vector<float>(kElements, 1.0f), kLowId + i, -5));
  }
  return frames;
}
std::vector<std::vector<uint8_t>> Highs() {
  std::vector<std::vector<uint8_t>> frames;
  for (int i = 0; i < kHigh; ++i) {
    frames.push_back(RequestBytes(wire::Op::kPushPull, 100 + i, 0, 1,
                                  std::vector<float>(kElements, 2.0f), kHighId + i, 7));
  }
  return frames;
}

// A client of either transport: writes frames, reads answers.
class Client {
 public:
  Client(const std::string& transport, ParameterServer* ps) {
    if (transport == "tcp") {
      tcp_ = std::make_unique<testing::RawTcp>(ps->tcp_port());
      Answer a;
      ok_ = tcp_->Hello(kToken, 0, &a) && a.header.code == 0;
      if (!ok_) error_ = "hello: " + std::to_string(a.header.code) + " " + a.message;
    } else {
      grpc_ = std::make_unique<testing::RawStream>("127.0.0.1:" + std::to_string(ps->port()),
                                                   kToken, "0");
      ok_ = true;
    }
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  bool Write(const std::vector<uint8_t>& b) { return tcp_ ? tcp_->Write(b) : grpc_->Write(b); }
  bool Read(Answer* a) { return tcp_ ? tcp_->Read(a) : grpc_->Read(a); }

 private:
  bool ok_ = false;
  std::string error_;
  std::unique_ptr<testing::RawTcp> tcp_;
  std::unique_ptr<testing::RawStream> grpc_;
};

// Waits (bounded) until `n` requests wait in the held serving queue. A server that serves in
// arrival order without the queue never gets there: the test goes on and fails on the order.
bool WaitQueued(const ServingQueueTestPeer& q, size_t n) {
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (q.Queued() < n) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Reads every answer; each high-priority answer must come before every low-priority one.
void ExpectHighFirst(Client& c) {
  std::vector<uint64_t> order;
  for (int i = 0; i < kLow + kHigh; ++i) {
    Answer a;
    ASSERT_TRUE(c.Read(&a));
    ASSERT_EQ(a.header.code, 0) << a.message;
    order.push_back(a.header.request_id);
  }
  size_t last_high = 0, first_low = order.size();
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] >= kHighId) last_high = i;
    if (order[i] < kHighId && first_low == order.size()) first_low = i;
  }
  EXPECT_LT(last_high, first_low) << "the server answered a low-priority request (id "
                                  << order[first_low] << ") before a high-priority one that "
                                  << "arrived after it";
}

class ServerPriorityTest : public ::testing::TestWithParam<std::string> {
 protected:
  // A server (W = 1, one pool thread: the serving order is the answer order) holding keys
  // 0..39 and 100..107, 16 floats each.
  void SetUp() override {
    std::vector<v1::KeySpec> keys;
    for (int i = 0; i < kLow; ++i) keys.push_back(testing::FloatKey(i, kElements));
    for (int i = 0; i < kHigh; ++i) keys.push_back(testing::FloatKey(100 + i, kElements));
    auto ps = testing::StartTestPserver(testing::TestPserverOptions(kToken), keys,
                                        testing::MapInstall::kOnStore);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
    queue_ = std::make_unique<ServingQueueTestPeer>(ps_->serving());
  }
  // Writes `frames` while the serving is held, and waits until `queued` requests wait in it:
  // all that was written is read, none served.
  void WriteHeld(Client& c, const std::vector<std::vector<uint8_t>>& frames, size_t queued) {
    for (const auto& f : frames) ASSERT_TRUE(c.Write(f));
    EXPECT_TRUE(WaitQueued(*queue_, queued)) << "the server did not take the requests";
  }
  std::unique_ptr<ParameterServer> ps_;
  std::unique_ptr<ServingQueueTestPeer> queue_;  // the server's serving queue
};

// Separate frames: the low-priority requests, then the high-priority ones, while the server's
// serving is held (the server is busy); released, it answers the later high-priority ones first.
TEST_P(ServerPriorityTest, HighPriorityRequestsArrivingLaterAreAnsweredFirst) {
  Client c(GetParam(), ps_.get());
  ASSERT_TRUE(c.ok()) << c.error();
  queue_->Hold();
  ASSERT_NO_FATAL_FAILURE(WriteHeld(c, Lows(), kLow));
  ASSERT_NO_FATAL_FAILURE(WriteHeld(c, Highs(), kLow + kHigh));
  queue_->Release();
  ExpectHighFirst(c);
}

// One bulk frame whose entries are the low-priority requests, then the high-priority ones.
TEST_P(ServerPriorityTest, BulkEntriesAreServedHighestPriorityFirst) {
  Client c(GetParam(), ps_.get());
  ASSERT_TRUE(c.ok()) << c.error();
  std::vector<std::vector<uint8_t>> entries = Lows(), highs = Highs();
  entries.insert(entries.end(), highs.begin(), highs.end());
  queue_->Hold();
  ASSERT_NO_FATAL_FAILURE(WriteHeld(c, {testing::BulkBytes(entries, 1, 0)}, kLow + kHigh));
  queue_->Release();
  ExpectHighFirst(c);
}

// A peer that sends far more requests than the server serves gets a bounded read-ahead: the
// server stops reading that connection at 1024 unserved requests (its socket or its stream's
// flow-control window fills), and serves them all once the serving goes on.
TEST_P(ServerPriorityTest, ReadAheadOfOneConnectionIsBounded) {
  Client c(GetParam(), ps_.get());
  ASSERT_TRUE(c.ok()) << c.error();
  constexpr int kMany = 3000;
  queue_->Hold();
  std::thread writer([&] {
    for (int i = 0; i < kMany; ++i) {
      // Unknown key: each is answered with an error frame once served.
      if (!c.Write(RequestBytes(wire::Op::kPull, 99999, 0, 0, {}, i + 1, 0))) return;
    }
  });
  const bool reached = WaitQueued(*queue_, 1024);
  if (reached) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const size_t queued = queue_->Queued();
  queue_->Release();
  writer.join();
  EXPECT_TRUE(reached);
  EXPECT_EQ(queued, 1024u) << "the read-ahead of one connection is not bounded";
  for (int i = 0; i < kMany; ++i) {
    Answer a;
    ASSERT_TRUE(c.Read(&a)) << i;
    EXPECT_EQ(a.header.code, static_cast<int32_t>(StatusCode::kNotFound)) << a.message;
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ServerPriorityTest, ::testing::Values("tcp", "grpc"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace trellis
