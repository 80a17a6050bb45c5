// The raw-TCP bulk transport: a connection over it against an in-process parameter server on 127.0.0.1:0,
// and a raw socket that sends bad hellos, garbage, oversized and truncated frames. Every bad
// peer gets an error naming the problem and the server keeps serving a good worker afterwards.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <shared_mutex>
#include <thread>

#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "common/config/env.h"
#include "datapath/tcp/wire.h"
#include "tests/testing/slice_reply.h"
#include "tests/testing/test_pserver.h"
#include "tests/testing/test_frames.h"
#include "worker-lib/src/server_connection.h"

namespace trellis {
namespace {

using testing::PushPullRequest;
using testing::ReplyBox;

constexpr char kToken[] = "tcp-test-token";
constexpr int64_t kTimeoutMs = 10000;

// A blocking raw TCP client for bad-peer tests.
class RawSocket {
 public:
  explicit RawSocket(int port) {
    auto fd = tcpwire::Connect("127.0.0.1", port, kTimeoutMs);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    fd_ = fd.ok() ? *fd : -1;
    timeval tv{10, 0};  // every read bounded
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    reader_ = std::make_unique<tcpwire::SocketReader>(fd_);
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  void Write(const std::vector<uint8_t>& bytes) {
    iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    ASSERT_TRUE(tcpwire::SendAll(fd_, &iov, 1).ok());
  }
  // Reads one response frame: code and message (payload skipped).
  bool ReadFrame(int32_t* code, std::string* message, uint64_t* id = nullptr) {
    uint8_t h[wire::kResponseHeaderBytes];
    if (!reader_->Read(h, sizeof h).ok()) return false;
    wire::ResponseHeader r;
    if (!tcpwire::DecodeResponseHeader(h, 1 << 30, &r).ok()) return false;
    message->resize(r.message_bytes);
    if (!reader_->Read(message->data(), r.message_bytes).ok()) return false;
    if (!reader_->Skip(r.payload_bytes).ok()) return false;
    *code = r.code;
    if (id != nullptr) *id = r.request_id;
    return true;
  }
  // True when the server closed the connection (EOF), as opposed to a timeout.
  bool ClosedByServer() {
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }
  void Hello(const std::string& token, int32_t rank) {
    Write(tcpwire::EncodeHello(token, rank));
    int32_t code = -1;
    std::string msg;
    ASSERT_TRUE(ReadFrame(&code, &msg));
    ASSERT_EQ(code, 0) << msg;
  }

 private:
  int fd_ = -1;
  std::unique_ptr<tcpwire::SocketReader> reader_;
};

class TcpTransportTest : public ::testing::Test {
 protected:
  void Start(int workers) {
    PserverOptions o = testing::TestPserverOptions(kToken);
    o.store.num_workers = workers;
    o.slice_bytes = 1 << 20;
    auto ps = testing::StartTestPserver(o, {testing::FloatKey(7, 4, "fc1")},
                                        testing::MapInstall::kByTest);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
    map_ = std::move(ps->map);
    ASSERT_GT(ps_->tcp_port(), 0);
  }
  ConnectionOptions Options(const std::string& token = kToken, int32_t rank = 0) {
    ConnectionOptions o;
    o.token = token;
    o.worker_rank = rank;
    o.slice_bytes = 1 << 20;
    o.timeout_ms = kTimeoutMs;
    return testing::ConnectionTo(*ps_, std::move(o));
  }
  std::unique_ptr<ServerConnection> Connect(int32_t rank = 0) {
    auto c = trellis::Connect(link::Transport::kTcp, Options(kToken, rank));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    EXPECT_TRUE((*c)->InstallShardMap(map_, 0, kTimeoutMs).ok());
    return std::move(*c);
  }
  // A PushPull of {1,2,3,4} * scale on key 7 at `step` answers the sum (W = 1: the values).
  void ExpectPushPull(ServerConnection& c, int64_t step, float scale = 1) {
    std::vector<float> grad = {1 * scale, 2 * scale, 3 * scale, 4 * scale};
    std::vector<float> out(4, -1);
    ReplyBox box;
    c.Send(PushPullRequest(7, step, grad, out), box.Reply());
    ASSERT_TRUE(box.Wait());
    ASSERT_TRUE(box.status.ok()) << box.status.ToString();
    EXPECT_TRUE(box.in_place);  // read straight into `out`
    EXPECT_EQ(out, grad);
  }

  std::unique_ptr<ParameterServer> ps_;
  v1::ShardMap map_;
};

TEST_F(TcpTransportTest, PushPullReadsStraightIntoOut) {
  Start(1);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  for (int step = 1; step <= 3; ++step) ExpectPushPull(*c, step, static_cast<float>(step));
}

TEST_F(TcpTransportTest, WrongOrMissingTokenIsRefused) {
  Start(1);
  auto wrong = trellis::Connect(link::Transport::kTcp, Options("not-the-token"));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(wrong.status().message().find("wrong job token"), std::string::npos)
      << wrong.status().ToString();
  auto missing = trellis::Connect(link::Transport::kTcp, Options(""));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(missing.status().message().find("missing job token"), std::string::npos);
  // The server still serves a worker with the right token.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ExpectPushPull(*c, 1);
}

TEST_F(TcpTransportTest, RankOutsideTheJobIsRefused) {
  Start(2);
  auto c = trellis::Connect(link::Transport::kTcp, Options(kToken, 2));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("worker rank 2 outside [0, 2)"), std::string::npos)
      << c.status().ToString();
}

TEST_F(TcpTransportTest, AddressWithoutTcpPortIsAClearError) {
  Start(1);
  ConnectionOptions o = Options();
  o.address.tcp_port = 0;
  auto c = trellis::Connect(link::Transport::kTcp, o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("advertised no TCP data port"), std::string::npos);
}

TEST(TcpWireTest, TheLocalSocketFollowsTheEnvironment) {
  using Env = std::map<std::string, std::string>;
  // Unset: the caller's default (a worker: on, use one when offered; trellis-pserver: off).
  EXPECT_TRUE(*LocalSocketEnabled(EnvSource(Env{}), true));
  EXPECT_FALSE(*LocalSocketEnabled(EnvSource(Env{}), false));
  EXPECT_TRUE(*LocalSocketEnabled(EnvSource(Env{{kLocalSocketEnv, "on"}}), false));
  EXPECT_FALSE(*LocalSocketEnabled(EnvSource(Env{{kLocalSocketEnv, "off"}}), true));
  auto bad = LocalSocketEnabled(EnvSource(Env{{kLocalSocketEnv, "maybe"}}), true);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("TRELLIS_LOCAL_SOCKET: must be on or off, got 'maybe'"),
            std::string::npos)
      << bad.status().ToString();
}

TEST_F(TcpTransportTest, GarbageInsteadOfHelloClosesThatConnectionOnly) {
  Start(1);
  RawSocket raw(ps_->tcp_port());
  raw.Write(std::vector<uint8_t>(64, 0xAB));
  int32_t code = 0;
  std::string msg;
  ASSERT_TRUE(raw.ReadFrame(&code, &msg));
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(msg.find("not a trellis data connection"), std::string::npos) << msg;
  EXPECT_TRUE(raw.ClosedByServer());
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ExpectPushPull(*c, 1);
}

TEST_F(TcpTransportTest, GarbageFrameAfterHelloGetsAnErrorAndTheServerServesOthers) {
  Start(1);
  auto good = Connect();  // connected before, and still served after
  ASSERT_NE(good, nullptr);
  RawSocket raw(ps_->tcp_port());
  raw.Hello(kToken, 0);
  std::vector<uint8_t> garbage(wire::kRequestHeaderBytes + 100);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(i * 37 + 11);
  raw.Write(garbage);
  int32_t code = 0;
  std::string msg;
  ASSERT_TRUE(raw.ReadFrame(&code, &msg));
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(msg.find("bad magic"), std::string::npos) << msg;
  EXPECT_TRUE(raw.ClosedByServer());
  ExpectPushPull(*good, 1);
  auto later = Connect();
  ASSERT_NE(later, nullptr);
  ExpectPushPull(*later, 2);
}

TEST_F(TcpTransportTest, OversizedLengthIsRefusedWithoutAllocating) {
  Start(1);
  RawSocket raw(ps_->tcp_port());
  raw.Hello(kToken, 0);
  auto frame = testing::RequestBytes(wire::Op::kPush, 7, 0, 1, {}, 5);
  const uint64_t huge = 1ull << 40;  // 1 TiB announced: must not be allocated
  std::memcpy(frame.data() + 40, &huge, sizeof huge);
  raw.Write(frame);
  int32_t code = 0;
  std::string msg;
  uint64_t id = 0;
  ASSERT_TRUE(raw.ReadFrame(&code, &msg, &id));
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_EQ(id, 5u);
  EXPECT_NE(msg.find("exceeds the"), std::string::npos) << msg;
  EXPECT_TRUE(raw.ClosedByServer());
}

TEST_F(TcpTransportTest, TruncatedFrameThenAGoodWorker) {
  Start(1);
  {
    RawSocket raw(ps_->tcp_port());
    raw.Hello(kToken, 0);
    auto frame = testing::RequestBytes(wire::Op::kPushPull, 7, 0, 1, {1, 2, 3, 4}, 9);
    frame.resize(frame.size() - 6);  // the peer dies mid-payload
    raw.Write(frame);
  }
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ExpectPushPull(*c, 1);  // the truncated push did not count
}

TEST_F(TcpTransportTest, BadRequestsGetErrorsAndTheConnectionGoesOn) {
  Start(1);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> g(4, 1), out(4);
  struct Case {
    uint64_t key;
    int64_t step;
    int64_t elements;
    StatusCode code;
    const char* text;
  };
  for (const Case& k : {Case{99, 1, 4, StatusCode::kNotFound, "unknown key 99"},
                        Case{7, 1, 3, StatusCode::kInvalidArgument, "of 3 elements"},
                        Case{7, 5, 4, StatusCode::kOutOfRange, "outside the window"}}) {
    ReplyBox box;
    SliceRequest r = PushPullRequest(k.key, k.step, g, out);
    r.payload_elements = k.elements;
    c->Send(r, box.Reply());
    ASSERT_TRUE(box.Wait());
    EXPECT_EQ(box.status.code(), k.code) << box.status.ToString();
    EXPECT_NE(box.status.message().find(k.text), std::string::npos) << box.status.ToString();
  }
  ExpectPushPull(*c, 1);
}

TEST_F(TcpTransportTest, BulkEntriesAreAnsweredEachIntoItsOut) {
  Start(1);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> g = {1, 2, 3, 4}, out1(4, -1), out2(4, -1);
  std::vector<SliceRequest> rs(3);
  rs[0].op = wire::Op::kPushPull;
  rs[0].key = 7;
  rs[0].step = 1;
  rs[0].payload = g.data();
  rs[0].payload_elements = 4;
  rs[0].out = out1.data();
  rs[0].out_elements = 4;
  rs[1].op = wire::Op::kPull;
  rs[1].key = 7;
  rs[1].step = 1;
  rs[1].out = out2.data();
  rs[1].out_elements = 4;
  rs[2].op = wire::Op::kPush;  // its own error, the others unaffected
  rs[2].key = 99;
  rs[2].step = 1;
  rs[2].payload = g.data();
  rs[2].payload_elements = 4;
  ReplyBox b0, b1, b2;
  std::atomic<int> sent{0};
  c->SendBulk(rs, {b0.Reply(), b1.Reply(), b2.Reply()}, [&] { sent.fetch_add(1); });
  ASSERT_TRUE(b0.Wait() && b1.Wait() && b2.Wait());
  EXPECT_TRUE(b0.status.ok()) << b0.status.ToString();
  EXPECT_TRUE(b1.status.ok()) << b1.status.ToString();
  EXPECT_EQ(b2.status.code(), StatusCode::kNotFound) << b2.status.ToString();
  EXPECT_EQ(out1, g);
  EXPECT_EQ(out2, g);
  // `sent` runs once the writer's sendmsg returned, which may be after the answers came back.
  for (int i = 0; i < 1000 && sent.load() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(sent.load(), 1);  // the frame went out once
  ExpectPushPull(*c, 2);
}

TEST_F(TcpTransportTest, MalformedBulkGetsAnErrorAndTheConnectionGoesOn) {
  Start(1);
  auto c = Connect();  // installs the shard map
  ASSERT_NE(c, nullptr);
  RawSocket s(ps_->tcp_port());
  s.Hello(kToken, 0);
  auto nested = testing::BulkBytes({testing::RequestBytes(wire::Op::kPush, 7, 0, 1, {1, 2, 3, 4})});
  s.Write(testing::BulkBytes({nested}, 41));
  int32_t code = 0;
  std::string msg;
  uint64_t id = 0;
  ASSERT_TRUE(s.ReadFrame(&code, &msg, &id));
  EXPECT_EQ(id, 41u);
  EXPECT_EQ(code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(msg.find("malformed bulk: entry 0: op bulk cannot travel in a bulk"),
            std::string::npos)
      << msg;
  // The same connection still serves: a good push, answered under its id.
  s.Write(testing::RequestBytes(wire::Op::kPush, 7, 0, 1, {1, 2, 3, 4}, 42));
  ASSERT_TRUE(s.ReadFrame(&code, &msg, &id));
  EXPECT_EQ(id, 42u);
  EXPECT_EQ(code, 0) << msg;
}

TEST_F(TcpTransportTest, CompletedOperationsOutIsNotWritten) {
  Start(1);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> grad = {1, 2, 3, 4}, out(4, -1);
  std::shared_mutex mu;
  std::atomic<bool> closed{true};  // the operation already completed (e.g. deadline)
  ReplyBox box;
  SliceRequest r = PushPullRequest(7, 1, grad, out);
  r.out_mu = &mu;
  r.out_closed = &closed;
  c->Send(r, box.Reply());
  ASSERT_TRUE(box.Wait());
  EXPECT_TRUE(box.status.ok());
  EXPECT_EQ(out, std::vector<float>(4, -1));  // discarded, not written
  ExpectPushPull(*c, 2);                       // the stream stayed in sync
}

TEST_F(TcpTransportTest, ShutdownAndCloseFailPendingRequestsWithoutHanging) {
  Start(2);  // worker 1 never pushes: worker 0's pull waits on the server
  auto c = Connect(0);
  ASSERT_NE(c, nullptr);
  std::vector<float> grad = {1, 2, 3, 4}, out(4);
  ReplyBox waiting, closing;
  SliceRequest r = PushPullRequest(7, 1, grad, out);
  c->Send(r, waiting.Reply());
  ps_->Shutdown();  // fails the waiting pull, closes the connection
  ASSERT_TRUE(waiting.Wait());
  EXPECT_EQ(waiting.status.code(), StatusCode::kUnavailable) << waiting.status.ToString();
  r.step = 2;
  c->Send(r, closing.Reply());  // on a dead connection: answered at once
  ASSERT_TRUE(closing.Wait());
  EXPECT_FALSE(closing.status.ok());
  c.reset();
}

}  // namespace
}  // namespace trellis
