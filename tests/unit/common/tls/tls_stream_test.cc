// The TLS stream of the raw data link and the job certificates: mutual authentication (a peer
// without a certificate, or with one from another CA, or under another name, is refused), data
// integrity in both directions at once, and a clean end when the peer goes away.
#include "common/tls/tls_stream.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <future>
#include <numeric>
#include <thread>

#include "common/tls/tls.h"
#include "common/tls/tls_gen.h"

namespace trellis {
namespace {

// A connected loopback TCP pair (real TCP: the kernel's tls module only attaches to TCP).
struct Pair {
  int client = -1;
  int server = -1;
  Pair() {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(l, 1), 0);
    EXPECT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    server = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    close(l);
  }
  ~Pair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

class TlsStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/trellis-tls-XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::filesystem::create_directories(dir_ + "/a");
    std::filesystem::create_directories(dir_ + "/b");
    auto a = WriteJobCertificates(dir_ + "/a");
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = WriteJobCertificates(dir_ + "/b");  // another job's CA
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    auto ja = LoadTls(*a);
    ASSERT_TRUE(ja.ok()) << ja.status().ToString();
    job_ = *ja;
    auto jb = LoadTls(*b);
    ASSERT_TRUE(jb.ok()) << jb.status().ToString();
    other_ = *jb;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Both handshakes at once; returns (server, client) results.
  static std::pair<StatusOr<std::unique_ptr<TlsStream>>, StatusOr<std::unique_ptr<TlsStream>>>
  Connect(const TlsContext& server_ctx, const TlsContext& client_ctx, Pair& p) {
    auto server = std::async(std::launch::async, [&] {
      return TlsStream::Handshake(server_ctx, p.server, 20000);
    });
    auto client = TlsStream::Handshake(client_ctx, p.client, 20000);
    if (!client.ok()) shutdown(p.client, SHUT_RDWR);  // the server must not wait for more
    return {server.get(), std::move(client)};
  }

  std::string dir_;
  TlsPtr job_;
  TlsPtr other_;
};

Status ReadFull(TlsStream& s, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  while (n > 0) {
    size_t got = 0;
    TRELLIS_RETURN_IF_ERROR(s.Read(d, n, true, &got));
    d += got;
    n -= got;
  }
  return Status::Ok();
}

TEST_F(TlsStreamTest, MutualHandshakeAndBothDirectionsAtOnce) {
  Pair p;
  auto connected = Connect(*job_->server_ctx, *job_->client_ctx, p);
  auto& server = connected.first;  // not a structured binding: clang 14 cannot capture one
  auto& client = connected.second;
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // Which record layer this kernel gave us (the bench and the logs print the same).
  std::printf("offload: client %s, server %s\n", (*client)->OffloadName().c_str(),
              (*server)->OffloadName().c_str());

  // 24 MiB each way, written as a header + payload iovec pair per frame, while the same stream
  // reads on another thread: the data link's reader and writer share a stream this way.
  constexpr size_t kFrames = 12, kPayload = 2 << 20;
  auto pattern = [](uint32_t seed, size_t n) {
    std::vector<uint32_t> v(n / 4);
    std::iota(v.begin(), v.end(), seed);
    return v;
  };
  auto writer = [&](TlsStream& s, uint32_t seed) {
    std::vector<uint32_t> payload = pattern(seed, kPayload);
    for (size_t f = 0; f < kFrames; ++f) {
      uint64_t head[6] = {f, seed, 0, 0, 0, kPayload};
      iovec iov[2] = {{head, sizeof head}, {payload.data(), kPayload}};
      Status st = s.WriteAll(iov, 2);
      if (!st.ok()) return st;
    }
    return Status::Ok();
  };
  auto reader = [&](TlsStream& s, uint32_t seed) -> Status {
    std::vector<uint32_t> want = pattern(seed, kPayload), got(kPayload / 4);
    for (size_t f = 0; f < kFrames; ++f) {
      uint64_t head[6];
      TRELLIS_RETURN_IF_ERROR(ReadFull(s, head, sizeof head));
      if (head[0] != f || head[5] != kPayload) return DataLossError("bad header");
      TRELLIS_RETURN_IF_ERROR(ReadFull(s, got.data(), kPayload));
      if (got != want) return DataLossError("payload differs in frame " + std::to_string(f));
    }
    return Status::Ok();
  };
  auto cw = std::async(std::launch::async, [&] { return writer(**client, 7); });
  auto sw = std::async(std::launch::async, [&] { return writer(**server, 1000); });
  auto cr = std::async(std::launch::async, [&] { return reader(**client, 1000); });
  Status sr = reader(**server, 7);
  EXPECT_TRUE(sr.ok()) << sr.ToString();
  EXPECT_TRUE(cw.get().ok());
  EXPECT_TRUE(sw.get().ok());
  Status c = cr.get();
  EXPECT_TRUE(c.ok()) << c.ToString();
}

TEST_F(TlsStreamTest, ClientOfAnotherCaIsRefused) {
  Pair p;
  auto [server, client] = Connect(*job_->server_ctx, *other_->client_ctx, p);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kUnauthenticated) << server.status().ToString();
  EXPECT_FALSE(client.ok());
}

TEST_F(TlsStreamTest, ServerOfAnotherCaIsRefusedByTheClient) {
  Pair p;
  auto [server, client] = Connect(*other_->server_ctx, *job_->client_ctx, p);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnauthenticated) << client.status().ToString();
  EXPECT_FALSE(server.ok());
}

TEST_F(TlsStreamTest, ClientWithoutCertificateIsRefused) {
  // A plain TLS client that trusts the job CA but presents nothing.
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  ASSERT_NE(ctx, nullptr);
  SSL_CTX_load_verify_locations(ctx, (dir_ + "/a/ca.crt").c_str(), nullptr);
  Pair p;
  auto server = std::async(std::launch::async, [&] {
    return TlsStream::Handshake(*job_->server_ctx, p.server, 20000);
  });
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, p.client);
  SSL_connect(ssl);  // TLS 1.3: the client finishes before the server judges it
  char byte;
  EXPECT_LE(SSL_read(ssl, &byte, 1), 0);  // the server's alert, then the end
  auto st = server.get();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), StatusCode::kUnauthenticated) << st.status().ToString();
  SSL_free(ssl);
  SSL_CTX_free(ctx);
}

TEST_F(TlsStreamTest, ServerUnderAnotherNameIsRefused) {
  TlsCredentials renamed = *job_;
  renamed.server_name = "not-trellis";
  auto ctx = TlsContext::Create(renamed, TlsContext::Side::kClient);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  Pair p;
  auto [server, client] = Connect(*job_->server_ctx, **ctx, p);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnauthenticated) << client.status().ToString();
}

TEST_F(TlsStreamTest, PlainTextPeerAndSilentPeerFailWithinTheDeadline) {
  {
    Pair p;
    auto server = std::async(std::launch::async, [&] {
      return TlsStream::Handshake(*job_->server_ctx, p.server, 20000);
    });
    const char hello[] = "TRH1 plain hello, not TLS at all.........";
    ASSERT_GT(write(p.client, hello, sizeof hello), 0);
    auto st = server.get();
    EXPECT_FALSE(st.ok());
  }
  {
    Pair p;
    auto start = std::chrono::steady_clock::now();
    auto st = TlsStream::Handshake(*job_->server_ctx, p.server, 300);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), StatusCode::kDeadlineExceeded);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  }
}

TEST_F(TlsStreamTest, PeerCloseEndsReadsAndReadTimeoutFires) {
  Pair p;
  auto [server, client] = Connect(*job_->server_ctx, *job_->client_ctx, p);
  ASSERT_TRUE(server.ok() && client.ok());
  (*server)->set_read_timeout_ms(200);
  char buf[16];
  size_t got = 0;
  Status st = (*server)->Read(buf, sizeof buf, true, &got);
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  (*server)->set_read_timeout_ms(0);
  client->reset();
  shutdown(p.client, SHUT_RDWR);
  close(p.client);
  p.client = -1;
  st = (*server)->Read(buf, sizeof buf, true, &got);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  // Writing to the closed peer is an error, not a SIGPIPE that kills the process.
  std::vector<uint8_t> big(8 << 20, 1);
  iovec iov{big.data(), big.size()};
  st = (*server)->WriteAll(&iov, 1);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
}

TEST(TlsFilesTest, EnvironmentAllOrNone) {
  auto none = TlsFilesFromEnv(EnvSource(std::map<std::string, std::string>{}));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->enabled());
  auto half = TlsFilesFromEnv(EnvSource(std::map<std::string, std::string>{{kEnvTlsCaFile, "/x/ca.crt"}}));
  ASSERT_FALSE(half.ok());
  EXPECT_NE(half.status().message().find("TRELLIS_TLS_KEY_FILE"), std::string::npos);
  std::map<std::string, std::string> env;
  TlsFiles f{"/c", "/t", "/k", "svc"};
  AddTlsEnv(f, &env);
  auto back = TlsFilesFromEnv(EnvSource(env));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->key_file, "/k");
  EXPECT_EQ(back->server_name, "svc");
}

TEST(TlsFilesTest, MissingOrMismatchedFilesAreClearErrors) {
  auto missing = LoadTls(TlsFiles{"/nonexistent/ca.crt", "/nonexistent/tls.crt", "/x", "t"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("CA file"), std::string::npos);
  char tmpl[] = "/tmp/trellis-tls-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::filesystem::create_directories(dir + "/a");
  std::filesystem::create_directories(dir + "/b");
  auto a = WriteJobCertificates(dir + "/a");
  auto b = WriteJobCertificates(dir + "/b");
  ASSERT_TRUE(a.ok() && b.ok());
  TlsFiles mixed = *a;
  mixed.key_file = b->key_file;  // another certificate's key
  auto st = LoadTls(mixed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("does not match"), std::string::npos)
      << st.status().ToString();
  EXPECT_EQ(std::filesystem::status(a->key_file).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace trellis
