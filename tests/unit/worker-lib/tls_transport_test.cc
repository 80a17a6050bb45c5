// The data path under mutual TLS, both transports, against an in-process parameter server:
// a worker with the job's certificate and token pushes and pulls; one with another CA's
// certificate or none (plaintext) is refused and the server keeps serving; the job token is
// still checked under TLS.
#include <gtest/gtest.h>

#include "pserver/parameter_server.h"
#include "tests/testing/slice_reply.h"
#include "tests/testing/test_pserver.h"
#include "tests/unit/common/tls/tls_fixture.h"
#include "worker-lib/src/server_connection.h"

namespace trellis {
namespace {

constexpr char kToken[] = "tls-test-token";
constexpr int64_t kTimeoutMs = 5000;
constexpr int kElements = 250000;  // 1 MB: many TLS records each way, one slice (under 1 MiB)

class TlsTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certs_.job && certs_.other);
    PserverOptions o = testing::TestPserverOptions(kToken);
    o.slice_bytes = 2 << 20;
    o.tls = certs_.job;
    auto ps = testing::StartTestPserver(o, {testing::FloatKey(7, kElements, "fc1")},
                                        testing::MapInstall::kByTest);
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    ps_ = std::move(ps->server);
    map_ = std::move(ps->map);
  }
  StatusOr<std::unique_ptr<ServerConnection>> Connect(TlsPtr tls, const std::string& token) {
    ConnectionOptions o;
    o.token = token;
    o.tls = std::move(tls);
    o.slice_bytes = 2 << 20;
    o.timeout_ms = kTimeoutMs;
    auto c = testing::ConnectTestPserver(*ps_, GetParam(), std::move(o));
    if (!c.ok()) return c.status();
    // The first call that must pass authentication (the gRPC stream opens lazily).
    TRELLIS_RETURN_IF_ERROR((*c)->InstallShardMap(map_, 0, kTimeoutMs));
    return std::move(*c);
  }
  // PushPull of a ramp * step on key 7: with one worker the answer is the ramp itself.
  void ExpectPushPull(ServerConnection& c, int64_t step) {
    std::vector<float> grad(kElements), out(kElements, -1);
    for (int i = 0; i < kElements; ++i) grad[i] = static_cast<float>(i % 1000) * step;
    testing::ReplyBox box;
    c.Send(testing::PushPullRequest(7, step, grad, out), box.Reply());
    ASSERT_TRUE(box.Wait(std::chrono::seconds(20)));
    ASSERT_TRUE(box.status.ok()) << box.status.ToString();
    EXPECT_EQ(box.in_place ? out : box.values, grad);
  }

  TlsCerts certs_;
  std::unique_ptr<ParameterServer> ps_;
  v1::ShardMap map_;
};

TEST_P(TlsTransportTest, JobCertificatePushesAndPulls) {
  auto c = Connect(certs_.job, kToken);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int step = 1; step <= 3; ++step) ExpectPushPull(**c, step);
}

TEST_P(TlsTransportTest, AnotherCaOrPlaintextIsRefusedAndTheServerKeepsServing) {
  auto good = Connect(certs_.job, kToken);  // connected before, served after
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  auto other = Connect(certs_.other, kToken);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().code(), StatusCode::kOk);
  auto plain = Connect(nullptr, kToken);
  ASSERT_FALSE(plain.ok());
  ExpectPushPull(**good, 1);
  auto later = Connect(certs_.job, kToken);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
}

TEST_P(TlsTransportTest, TokenIsStillCheckedUnderTls) {
  auto wrong = Connect(certs_.job, "not-the-token");
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnauthenticated) << wrong.status().ToString();
  auto good = Connect(certs_.job, kToken);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  ExpectPushPull(**good, 1);
}

INSTANTIATE_TEST_SUITE_P(Transports, TlsTransportTest, ::testing::Values("tcp", "grpc"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace trellis
