// What a connection costs the TCP listener before its hello (issue 16 §1): no thread, a hello
// deadline that fires (also for a peer that trickles bytes, and under TLS), caps on pending and
// total connections that refuse with a log line while an admitted worker keeps being served,
// descriptors closed as soon as a connection ends, and an admitted connection the server has no
// thread for refused with an error frame that says so. Before: every connection got two threads
// at accept, a silent one stayed for ever (the receive timeout read as "0 bytes"), nothing was
// capped, and a closed connection's descriptor stayed open until the next accept.
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/test_pserver.h"
#include "tests/unit/common/tls/tls_fixture.h"
#include "tests/unit/pserver/raw_tcp.h"
#include "tests/testing/test_frames.h"

// Thread creation that fails on demand, as at the process's thread or memory limit, and only on
// the TCP listener's loop thread ("pserver-tcp-acc"), where a connection's threads start. This
// definition comes before libc's for every caller in the process, std::thread included.
namespace {
// The loop's next thread creations: this many pass, the next fails with EAGAIN; -1: none fails.
std::atomic<int> g_refuse_thread_at{-1};
}  // namespace

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*start)(void*), void* arg) noexcept {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const auto real = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  char name[16] = "";
  if (g_refuse_thread_at.load() >= 0 &&
      pthread_getname_np(pthread_self(), name, sizeof name) == 0 &&
      std::strcmp(name, "pserver-tcp-acc") == 0 && g_refuse_thread_at.fetch_sub(1) == 0) {
    return EAGAIN;
  }
  return real(thread, attr, start, arg);
}

namespace trellis {
namespace {

using namespace std::chrono_literals;
using testing::RawTcp;
using testing::RequestBytes;

constexpr char kToken[] = "tok";

int Entries(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}
int Threads() { return Entries("/proc/self/task"); }
int Descriptors() { return Entries("/proc/self/fd"); }

// Enough descriptors for `n` connections, both ends in this process; false: skip.
bool RaiseFileLimit(rlim_t n) {
  rlimit r{};
  getrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_cur < n) {
    r.rlim_cur = std::min<rlim_t>(r.rlim_max, n);
    setrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur >= n;
}

// W = 1, one float32 key of 4 elements (id 7), installed on the store.
std::unique_ptr<ParameterServer> StartServer(TcpAdmissionLimits limits, TlsPtr tls = nullptr,
                                             bool local_socket = false) {
  PserverOptions o = testing::TestPserverOptions(kToken);
  o.service.pool_threads = 2;
  o.tcp_limits = limits;
  o.tls = std::move(tls);
  o.local_socket = local_socket;
  auto ps = testing::StartTestPserver(o, {testing::FloatKey(7, 4)}, testing::MapInstall::kOnStore);
  EXPECT_TRUE(ps.ok()) << ps.status().ToString();
  return ps.ok() ? std::move(ps->server) : nullptr;
}

void Authenticate(RawTcp& c) {
  testing::Answer a;
  ASSERT_TRUE(c.Hello(kToken, 0, &a)) << "no verdict on the hello";
  ASSERT_EQ(a.header.code, 0) << a.message;
}

// A worker's round trip on an admitted connection (W = 1: the answer is the push).
void ExpectServing(RawTcp& c, int64_t step) {
  ASSERT_TRUE(c.Write(RequestBytes(wire::Op::kPushPull, 7, 0, step, {1, 2, 3, 4}, 100 + step)));
  testing::Answer a;
  ASSERT_TRUE(c.Read(&a));
  EXPECT_EQ(a.header.code, 0) << a.message;
  EXPECT_EQ(a.header.request_id, uint64_t(100 + step));
  EXPECT_EQ(a.values, (std::vector<float>{1, 2, 3, 4}));
}

TEST(TcpAdmissionTest, SilentPartialAndTricklingHellosAreClosedAtTheDeadline) {
  TcpAdmissionLimits limits;
  limits.hello_timeout_ms = 1000;
  auto ps = StartServer(limits);
  ASSERT_TRUE(ps);
  ::testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  RawTcp silent(ps->tcp_port());
  RawTcp partial(ps->tcp_port());
  RawTcp trickle(ps->tcp_port());
  auto hello = tcpwire::EncodeHello(kToken, 0);
  ASSERT_TRUE(partial.Write({hello.begin(), hello.begin() + 10}));  // magic, version, half a rank
  // One byte every 200 ms: each read gets something, the whole hello never comes in time.
  bool trickle_closed = false;
  for (size_t i = 0; i < hello.size() - 1 && !trickle_closed; ++i) {
    trickle.Write({hello[i]});
    trickle_closed = trickle.ClosedWithin(200);
  }
  EXPECT_TRUE(trickle_closed || trickle.ClosedWithin(8000)) << "a trickling hello stayed open";
  EXPECT_TRUE(silent.ClosedWithin(8000)) << "a silent connection stayed open";
  EXPECT_TRUE(partial.ClosedWithin(8000)) << "a partial hello stayed open";
  EXPECT_GE(std::chrono::steady_clock::now() - start, 900ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("no whole hello within 1000 ms"), std::string::npos) << log;
  // A worker that says hello in time is served.
  RawTcp worker(ps->tcp_port());
  Authenticate(worker);
  ExpectServing(worker, 1);
}

TEST(TcpAdmissionTest, IdleConnectionsAddNoThreads) {
  if (!RaiseFileLimit(1400)) GTEST_SKIP() << "needs 1400 descriptors";
  auto ps = StartServer({});
  ASSERT_TRUE(ps);
  RawTcp worker(ps->tcp_port());
  Authenticate(worker);
  ExpectServing(worker, 1);
  const int before = Threads();
  std::vector<std::unique_ptr<RawTcp>> idle;
  for (int i = 0; i < 500; ++i) {
    idle.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
    ASSERT_GE(idle.back()->fd(), 0);
  }
  auto hello = tcpwire::EncodeHello(kToken, 0);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(idle[i]->Write({hello.begin(), hello.begin() + 7}));
  ExpectServing(worker, 2);  // the listener took them all in meanwhile
  std::this_thread::sleep_for(500ms);
  const int after = Threads();
  EXPECT_LE(after - before, 1) << before << " threads before 500 idle connections, " << after
                               << " after";
  for (auto& c : idle) EXPECT_FALSE(c->ClosedWithin(0));  // held until their deadline
}

TEST(TcpAdmissionTest, CapsRefuseWithALogLineWhileAnAdmittedWorkerIsServed) {
  TcpAdmissionLimits limits;
  limits.max_pending = 4;
  limits.max_connections = 6;
  auto ps = StartServer(limits);
  ASSERT_TRUE(ps);
  RawTcp worker(ps->tcp_port());
  Authenticate(worker);
  ExpectServing(worker, 1);

  ::testing::internal::CaptureStderr();
  // The pending cap: four connections wait for their hello, a fifth is closed at once.
  std::vector<std::unique_ptr<RawTcp>> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
  ExpectServing(worker, 2);  // the four were accepted meanwhile (the listener is one loop)
  RawTcp over(ps->tcp_port());
  EXPECT_TRUE(over.ClosedWithin(8000)) << "a connection over the pending cap stayed open";
  for (auto& c : idle) EXPECT_FALSE(c->ClosedWithin(0));
  // The total cap: two idle ones leave, two more workers are admitted, one more idle: 3 + 3 = 6
  // connections; the seventh is closed at once.
  idle.resize(2);
  std::this_thread::sleep_for(300ms);
  RawTcp w2(ps->tcp_port()), w3(ps->tcp_port());
  Authenticate(w2);
  Authenticate(w3);
  idle.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
  std::this_thread::sleep_for(1100ms);  // past the one-line-a-second limit
  RawTcp over_total(ps->tcp_port());
  EXPECT_TRUE(over_total.ClosedWithin(8000)) << "a connection over the total cap stayed open";
  std::this_thread::sleep_for(100ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("4 connections wait for their hello (cap 4)"), std::string::npos) << log;
  EXPECT_NE(log.find("6 data connections open (cap 6)"), std::string::npos) << log;
  // Refusing others costs the admitted workers nothing.
  ExpectServing(worker, 3);
  ExpectServing(w2, 4);
}

TEST(TcpAdmissionTest, DescriptorsOfEndedConnectionsAreClosedAtOnce) {
  auto ps = StartServer({});
  ASSERT_TRUE(ps);
  RawTcp first(ps->tcp_port());
  Authenticate(first);
  const int before = Descriptors();
  {
    std::vector<std::unique_ptr<RawTcp>> workers;
    for (int i = 0; i < 20; ++i) {
      workers.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
      Authenticate(*workers.back());
    }
    ExpectServing(*workers.back(), 1);
  }
  // Our 20 ends are closed; the server's must follow without another connection coming in.
  int now = Descriptors();
  for (int i = 0; i < 100 && now > before; ++i) {
    std::this_thread::sleep_for(50ms);
    now = Descriptors();
  }
  EXPECT_LE(now, before) << "descriptors of ended connections still open";
  ExpectServing(first, 2);
}

// The local socket (a Unix socket beside the TCP port, for workers in the server's network
// namespace) is one more door into the same admission: the same hello and token check, the same
// hello deadline, the same caps counted over both doors.
TEST(TcpAdmissionTest, TheLocalSocketHasTheSameHelloDeadlineAndCaps) {
  TcpAdmissionLimits limits;
  limits.hello_timeout_ms = 5000;
  limits.max_pending = 2;
  auto ps = StartServer(limits, nullptr, /*local_socket=*/true);
  ASSERT_TRUE(ps);
  const std::string name = ps->local_name();
  ASSERT_FALSE(name.empty());
  ::testing::internal::CaptureStderr();
  {
    RawTcp stranger(name);
    testing::Answer a;
    ASSERT_TRUE(stranger.Hello("not-the-token", 0, &a));
    EXPECT_EQ(a.header.code, static_cast<int32_t>(StatusCode::kUnauthenticated)) << a.message;
    EXPECT_TRUE(stranger.ClosedWithin(8000));
  }
  RawTcp worker(name);
  Authenticate(worker);
  ExpectServing(worker, 1);
  // Two silent connections, one per door, fill the pending cap: a third on either is closed.
  RawTcp silent_tcp(ps->tcp_port()), silent_local(name);
  ExpectServing(worker, 2);
  std::this_thread::sleep_for(300ms);  // both accepted meanwhile, well before their deadline
  const auto over_at = std::chrono::steady_clock::now();
  RawTcp over(name);
  // Closed for the cap, at once: well before the 5 s hello deadline.
  EXPECT_TRUE(over.ClosedWithin(8000)) << "a local connection over the pending cap stayed open";
  EXPECT_LT(std::chrono::steady_clock::now() - over_at, 4s);
  EXPECT_TRUE(silent_local.ClosedWithin(12000)) << "a silent local connection stayed open";
  EXPECT_TRUE(silent_tcp.ClosedWithin(12000));
  std::this_thread::sleep_for(100ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string me = "local socket, pid " + std::to_string(getpid());
  EXPECT_NE(log.find("refusing data connection from " + me), std::string::npos) << log;
  EXPECT_NE(log.find("worker 0 connected from " + me), std::string::npos) << log;
  EXPECT_NE(log.find("2 connections wait for their hello (cap 2)"), std::string::npos) << log;
  EXPECT_NE(log.find("no whole hello within 5000 ms"), std::string::npos) << log;
  ExpectServing(worker, 3);
}

TEST(TcpAdmissionTest, NoLocalSocketUnlessAskedFor) {
  auto ps = StartServer({});
  ASSERT_TRUE(ps);
  EXPECT_EQ(ps->local_name(), "");
}

// With TLS on there is no local socket: the record layer's kernel offload (kTLS) runs on TCP
// only, so a TLS job keeps its bytes there.
TEST(TcpAdmissionTest, NoLocalSocketUnderTls) {
  TlsCerts certs;
  ASSERT_TRUE(certs.job);
  auto ps = StartServer({}, certs.job, /*local_socket=*/true);
  ASSERT_TRUE(ps);
  EXPECT_EQ(ps->local_name(), "");
}

// Under TLS the handshake is part of what comes before the hello: the same bounds hold.
TEST(TcpAdmissionTest, TlsConnectionsWithoutAHelloCostNoThreadAndAreClosedAtTheDeadline) {
  TlsCerts certs;
  ASSERT_TRUE(certs.job);
  TcpAdmissionLimits limits;
  limits.hello_timeout_ms = 3000;
  auto ps = StartServer(limits, certs.job);
  ASSERT_TRUE(ps);
  RawTcp worker(ps->tcp_port());
  ASSERT_TRUE(worker.StartTls(*certs.job).ok());
  Authenticate(worker);
  ExpectServing(worker, 1);
  const int before = Threads();
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<RawTcp>> silent, handshaken;
  for (int i = 0; i < 40; ++i) silent.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
  for (int i = 0; i < 20; ++i) {
    handshaken.push_back(std::make_unique<RawTcp>(ps->tcp_port()));
    ASSERT_TRUE(handshaken.back()->StartTls(*certs.job).ok());
  }
  ExpectServing(worker, 2);
  const int after = Threads();
  EXPECT_LE(after - before, 1) << before << " threads before 60 TLS connections without a hello, "
                               << after << " after";
  for (auto& c : silent) EXPECT_TRUE(c->ClosedWithin(12000)) << "a silent TLS connection stayed";
  for (auto& c : handshaken) {
    EXPECT_TRUE(c->ClosedWithin(12000)) << "a TLS connection without a hello stayed";
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 2900ms);
  ExpectServing(worker, 3);
  RawTcp later(ps->tcp_port());
  ASSERT_TRUE(later.StartTls(*certs.job).ok());
  Authenticate(later);
  ExpectServing(later, 4);
}

// When the system has no thread for an admitted connection (the process at its thread or
// memory limit), that connection is refused with a frame that says so and closed; the server
// goes on serving the others and admits later ones. The param: which of the connection's two
// threads (0: the writer, started first; 1: the reader) cannot be created; `tls`: under TLS.
class TcpNoThreadTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(TcpNoThreadTest, ConnectionWithoutItsThreadIsRefusedAndOthersAreServed) {
  const int refused_thread = std::get<0>(GetParam());
  const bool tls = std::get<1>(GetParam());  // not a structured binding: clang 14 cannot capture one
  TlsCerts certs;
  if (tls) {
    ASSERT_TRUE(certs.job);
  }
  auto ps = StartServer({}, tls ? certs.job : nullptr);
  ASSERT_TRUE(ps);
  auto connect = [&](RawTcp& c) { return tls ? c.StartTls(*certs.job) : Status::Ok(); };
  RawTcp worker(ps->tcp_port());
  ASSERT_TRUE(connect(worker).ok());
  Authenticate(worker);
  ExpectServing(worker, 1);

  ::testing::internal::CaptureStderr();
  g_refuse_thread_at = refused_thread;
  RawTcp refused(ps->tcp_port());
  testing::Answer verdict;
  const bool answered = connect(refused).ok() && refused.Hello(kToken, 0, &verdict);
  const bool closed = refused.ClosedWithin(8000);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(answered) << "no verdict: the connection without a thread was dropped silently";
  EXPECT_EQ(g_refuse_thread_at.load(), -1) << "the server started no thread for the connection";
  EXPECT_EQ(verdict.header.code, static_cast<int32_t>(StatusCode::kUnavailable)) << verdict.message;
  EXPECT_NE(verdict.message.find("cannot start a thread for this connection now; try again"),
            std::string::npos)
      << verdict.message;
  EXPECT_TRUE(closed) << "the refused connection stayed open";
  EXPECT_NE(log.find("(worker 0): no thread for it: "), std::string::npos) << log;

  ExpectServing(worker, 2);
  RawTcp later(ps->tcp_port());
  ASSERT_TRUE(connect(later).ok());
  Authenticate(later);
  ExpectServing(later, 3);
}

INSTANTIATE_TEST_SUITE_P(
    WriterOrReader, TcpNoThreadTest, ::testing::Combine(::testing::Values(0, 1), ::testing::Bool()),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) == 0 ? "Writer" : "Reader") +
             (std::get<1>(info.param) ? "Tls" : "Plaintext");
    });

}  // namespace
}  // namespace trellis
