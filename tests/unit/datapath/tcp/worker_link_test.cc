// The worker's TCP link (datapath/tcp/worker_link.h) against a hand-driven server socket: the link
// contract the worker's connection relies on (link.h). Frames go out as written, answers come
// back in arrival order with their payloads where the receiver puts them, and OnClosed runs
// exactly once, after which nothing is sent and no `sent` runs.
#include "datapath/tcp/worker_link.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "datapath/tcp/wire.h"
#include "tests/testing/test_frames.h"
#include "tests/unit/datapath/link_recorder.h"

namespace trellis::link {
namespace {

using namespace std::chrono_literals;

constexpr char kToken[] = "job-token";

// One server-side connection: accepts the link's socket, reads its hello and answers it with
// `verdict` (OK: the test then reads requests and writes answers by hand). With `local`, it also
// listens on a local socket (local_name()) and accepts from whichever the link connects to.
class HandServer {
 public:
  explicit HandServer(Status verdict = Status::Ok(), bool local = false) {
    auto fd = tcpwire::Listen("127.0.0.1", 0, &port_);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    listen_fd_ = fd.ok() ? *fd : -1;
    if (local) {
      local_name_ = *NewLocalName();
      auto l = tcpwire::ListenLocal(local_name_);
      EXPECT_TRUE(l.ok()) << l.status().ToString();
      local_fd_ = l.ok() ? *l : -1;
    }
    acceptor_ = std::thread([this, verdict] {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {local_fd_, POLLIN, 0}};
      if (::poll(p, local_fd_ >= 0 ? 2 : 1, 20000) <= 0) return;
      accepted_local_ = local_fd_ >= 0 && (p[1].revents & POLLIN) != 0;
      conn_ = ::accept(accepted_local_ ? local_fd_ : listen_fd_, nullptr, nullptr);
      if (conn_ < 0) return;
      reader_ = std::make_unique<tcpwire::SocketReader>(conn_);
      uint8_t fixed[tcpwire::kHelloFixedBytes];
      uint32_t token_bytes = 0;
      if (!reader_->Read(fixed, sizeof fixed).ok()) return;
      if (!tcpwire::CheckHelloFixed(fixed, &token_bytes).ok()) return;
      std::string token(token_bytes, '\0');
      if (!reader_->Read(token.data(), token.size()).ok()) return;
      hello_token_ = token;
      Send(wire::EncodeStatusFrame(wire::Op::kPush, 0, verdict));
    });
  }
  ~HandServer() {
    if (acceptor_.joinable()) acceptor_.join();
    if (conn_ >= 0) ::close(conn_);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (local_fd_ >= 0) ::close(local_fd_);
  }
  int port() const { return port_; }
  const std::string& local_name() const { return local_name_; }
  bool accepted_local() {
    if (acceptor_.joinable()) acceptor_.join();
    return accepted_local_;
  }
  const std::string& hello_token() {
    if (acceptor_.joinable()) acceptor_.join();
    return hello_token_;
  }

  // The next request frame: its header, and its payload as floats.
  wire::RequestHeader ReadRequest(std::vector<float>* payload) {
    uint8_t head[wire::kRequestHeaderBytes];
    wire::RequestHeader h;
    EXPECT_TRUE(reader_->Read(head, sizeof head).ok());
    EXPECT_TRUE(tcpwire::DecodeRequestHeader(head, 64 << 20, &h).ok());
    payload->resize(h.payload_bytes / sizeof(float));
    if (h.payload_bytes > 0) {
      EXPECT_TRUE(reader_->Read(payload->data(), h.payload_bytes).ok());
    }
    return h;
  }
  void Answer(uint64_t id, const std::vector<float>& payload, uint64_t claimed_bytes = ~0ull) {
    Send(testing::ResponseBytes(id, payload, claimed_bytes));
  }
  void Send(const std::vector<uint8_t>& bytes) {
    iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    EXPECT_TRUE(tcpwire::SendAll(conn_, &iov, 1).ok());
  }
  void Close() { ::shutdown(conn_, SHUT_RDWR); }

 private:
  int listen_fd_ = -1;
  int local_fd_ = -1;
  std::string local_name_;
  bool accepted_local_ = false;
  int port_ = 0;
  int conn_ = -1;
  std::unique_ptr<tcpwire::SocketReader> reader_;
  std::string hello_token_;
  std::thread acceptor_;
};

LinkOptions Options(int port) {
  LinkOptions o;
  o.address.service = "127.0.0.1:1";  // only named in messages
  o.address.tcp_port = port;
  o.token = kToken;
  o.worker_rank = 0;
  o.max_answer_payload = 16 << 20;
  o.timeout_ms = 10000;
  return o;
}

OutFrame Frame(uint64_t id, const std::vector<float>& payload, std::atomic<int>* sent) {
  OutFrame f;
  wire::RequestHeader h;
  h.op = wire::Op::kPushPull;
  h.request_id = id;
  h.key = 7;
  h.payload_bytes = payload.size() * sizeof(float);
  wire::EncodeRequestHeader(h, f.first.head);
  f.first.payload = payload.data();
  f.first.payload_bytes = h.payload_bytes;
  f.sent = [sent] { sent->fetch_add(1); };
  return f;
}

std::vector<float> Iota(size_t n, float from) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

// Connects to `server` (with `o`), starts the link reporting to `rec` and waits for the hello.
std::unique_ptr<WorkerLink> StartedLink(HandServer& server, Recorder& rec, const LinkOptions& o) {
  auto l = ConnectTcpLink(o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  if (!l.ok()) return nullptr;
  (*l)->Start(&rec);
  server.hello_token();
  return std::move(*l);
}

class TcpLinkTest : public ::testing::TestWithParam<bool> {};  // param: read with View()

TEST_P(TcpLinkTest, FramesGoOutAsWrittenAndAnswersComeBackInArrivalOrder) {
  HandServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  rec.view = GetParam();
  auto l = StartedLink(server, rec, Options(server.port()));
  ASSERT_TRUE(l);
  EXPECT_EQ(server.hello_token(), kToken);
  // A small frame (the caller's thread may send it itself) and a 2 MiB one (the writer's).
  const auto small = Iota(4, 1), big = Iota(512 << 10, 0.5f);
  std::atomic<int> sent{0};
  l->Write(Frame(11, small, &sent));
  l->Write(Frame(12, big, &sent));
  std::vector<float> got;
  auto h1 = server.ReadRequest(&got);
  EXPECT_EQ(h1.request_id, 11u);
  EXPECT_EQ(got, small);
  auto h2 = server.ReadRequest(&got);
  EXPECT_EQ(h2.request_id, 12u);
  EXPECT_EQ(h2.key, 7u);
  EXPECT_EQ(got, big);
  // Answered in the other order: delivered as they arrive.
  server.Answer(12, Iota(512 << 10, 3));
  server.Answer(11, {9, 8});
  auto answers = rec.WaitAnswers(2);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].first, 12u);
  EXPECT_EQ(answers[0].second, Iota(512 << 10, 3));
  EXPECT_EQ(answers[1].first, 11u);
  EXPECT_EQ(answers[1].second, (std::vector<float>{9, 8}));
  EXPECT_EQ(WaitSent(sent, 2), 2);
  EXPECT_EQ(rec.closed(), 0);
  l.reset();
  EXPECT_EQ(rec.closed(), 1);
  EXPECT_EQ(rec.WaitClosed().code(), StatusCode::kCancelled);
}

TEST_P(TcpLinkTest, APayloadLeftUnreadIsSkipped) {
  HandServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  rec.view = GetParam();
  rec.skip_first = true;
  auto l = StartedLink(server, rec, Options(server.port()));
  ASSERT_TRUE(l);
  server.Answer(1, Iota(1000, 0));
  server.Answer(2, Iota(3, 7));
  auto answers = rec.WaitAnswers(2);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[1].first, 2u);
  EXPECT_EQ(answers[1].second, Iota(3, 7));
  EXPECT_EQ(rec.closed(), 0);
}

INSTANTIATE_TEST_SUITE_P(ReadIntoOrView, TcpLinkTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "View" : "ReadInto"; });

TEST(TcpLink, APeerThatClosesEndsTheLinkOnceAndLaterFramesAreDropped) {
  HandServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec, Options(server.port()));
  ASSERT_TRUE(l);
  server.Close();
  const Status st = rec.WaitClosed();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("data connection to 127.0.0.1:1 ended"), std::string::npos)
      << st.ToString();
  // Written after the end: never sent, its `sent` never runs, its payload never read.
  std::atomic<int> sent{0};
  l->Write(Frame(1, Iota(4, 0), &sent));
  l->Write(Frame(2, Iota(2 << 20, 0), &sent));
  l.reset();
  EXPECT_EQ(sent.load(), 0);
  EXPECT_EQ(rec.closed(), 1);
}

TEST(TcpLink, AnErrorAboutTheStreamEndsTheLinkWithIt) {
  HandServer server;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec, Options(server.port()));
  ASSERT_TRUE(l);
  server.Send(wire::EncodeStatusFrame(wire::Op::kPush, 0,
                                         ResourceExhaustedError("too many requests unserved")));
  const Status st = rec.WaitClosed();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("too many requests unserved"), std::string::npos) << st.ToString();
  EXPECT_TRUE(rec.WaitAnswers(0).empty());  // not delivered as an answer
}

TEST(TcpLink, AnAnswerAboveTheLimitEndsTheLinkBeforeItsPayload) {
  HandServer server;
  LinkOptions o = Options(server.port());
  o.max_answer_payload = 1 << 20;
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec, o);
  ASSERT_TRUE(l);
  server.Answer(5, {}, /*claimed_bytes=*/uint64_t{1} << 40);  // a terabyte, never sent
  const Status st = rec.WaitClosed();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_TRUE(rec.WaitAnswers(0).empty());
}

TEST(TcpLink, WrongTokenIsRefusedAtConnect) {
  // A server that answers the hello with an error: ConnectTcpLink fails with it, no link.
  HandServer server(UnauthenticatedError("wrong job token"));
  auto l = ConnectTcpLink(Options(server.port()));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kUnauthenticated) << l.status().ToString();
  EXPECT_NE(l.status().message().find("wrong job token"), std::string::npos);
}

// A server on this host offers its local socket in the data address (";local=NAME"): the link
// connects there, and frames and answers go through it as over TCP.
TEST(TcpLink, UsesTheServersLocalSocketWhenItIsReachable) {
  HandServer server(Status::Ok(), /*local=*/true);
  LinkOptions o = Options(server.port());
  o.address.local_name = server.local_name();
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec, o);
  ASSERT_TRUE(l);
  EXPECT_TRUE(server.accepted_local());
  EXPECT_EQ(server.hello_token(), kToken);
  const auto big = Iota(512 << 10, 0.25f);
  std::atomic<int> sent{0};
  l->Write(Frame(21, big, &sent));
  std::vector<float> got;
  EXPECT_EQ(server.ReadRequest(&got).request_id, 21u);
  EXPECT_EQ(got, big);
  server.Answer(21, Iota(512 << 10, 2));
  auto answers = rec.WaitAnswers(1);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].second, Iota(512 << 10, 2));
  EXPECT_EQ(WaitSent(sent, 1), 1);
}

// From another host or network namespace the name reaches nothing: the link connects over TCP,
// with no error and no delay.
TEST(TcpLink, FallsBackToTcpWhenTheLocalSocketIsNotReachable) {
  HandServer server;
  LinkOptions o = Options(server.port());
  o.address.local_name = *NewLocalName();  // nobody listens under it
  Recorder rec;  // outlives the link, which reports to it until destroyed
  auto l = StartedLink(server, rec, o);
  ASSERT_TRUE(l);
  EXPECT_FALSE(server.accepted_local());
  std::atomic<int> sent{0};
  l->Write(Frame(3, Iota(4, 1), &sent));
  std::vector<float> got;
  EXPECT_EQ(server.ReadRequest(&got).request_id, 3u);
  EXPECT_EQ(got, Iota(4, 1));
}

TEST(TcpLink, NoTcpPortIsAClearError) {
  LinkOptions o = Options(0);
  auto l = ConnectTcpLink(o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("advertised no TCP data port"), std::string::npos);
}

}  // namespace
}  // namespace trellis::link
