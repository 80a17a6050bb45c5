// The scheduler's gRPC under mutual TLS: a client with the job's certificate and token is
// served; one with another CA's certificate, or none (plaintext), is refused and the scheduler
// keeps serving; the job token is still checked under TLS.
#include <gtest/gtest.h>

#include "scheduler/scheduler_client.h"
#include "scheduler/scheduler_service.h"
#include "tests/unit/common/tls/tls_fixture.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

// A job's certificates (the job's CA and another job's), made once per test.
class SchedulerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(certs_.job && certs_.other);
    SchedulerConfig config;
    config.job_name = "mlp";
    config.num_servers = 1;
    config.num_workers = 1;
    config.slice_bytes = 64;
    SchedulerServerOptions options;
    options.host = "127.0.0.1";
    options.tls = certs_.job;
    options.service.token = "s3cret";
    options.service.job_yaml = "kind: TrainingJob\n";
    auto server = SchedulerServer::Start(config, options);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
  }
  StatusOr<std::string> Call(const std::string& token, TlsPtr tls) {
    SchedulerClientOptions o;
    o.address = server_->address();
    o.token = token;
    o.rpc_timeout = 3s;
    o.tls = std::move(tls);
    auto c = SchedulerClient::Connect(o);
    if (!c.ok()) return c.status();
    return (*c)->GetJobYaml();
  }

  TlsCerts certs_;
  std::unique_ptr<SchedulerServer> server_;
};

TEST_F(SchedulerTlsTest, JobCertificateAndTokenAreServed) {
  auto y = Call("s3cret", certs_.job);
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, "kind: TrainingJob\n");
}

TEST_F(SchedulerTlsTest, AnotherCaOrPlaintextIsRefusedAndTheSchedulerKeepsServing) {
  // The handshake fails, so the call never reaches the service: the channel stays unready
  // (UNAVAILABLE, or DEADLINE_EXCEEDED while the first call waits for the scheduler to come up).
  auto refused = [](const StatusOr<std::string>& r) {
    return !r.ok() && (r.status().code() == StatusCode::kUnavailable ||
                       r.status().code() == StatusCode::kDeadlineExceeded);
  };
  auto other = Call("s3cret", certs_.other);
  EXPECT_TRUE(refused(other)) << other.status().ToString();
  auto plain = Call("s3cret", nullptr);
  EXPECT_TRUE(refused(plain)) << plain.status().ToString();
  auto good = Call("s3cret", certs_.job);
  EXPECT_TRUE(good.ok()) << good.status().ToString();
}

TEST_F(SchedulerTlsTest, TokenIsStillCheckedUnderTls) {
  auto wrong = Call("not-it", certs_.job);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnauthenticated) << wrong.status().ToString();
  auto none = Call("", certs_.job);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnauthenticated) << none.status().ToString();
}

}  // namespace
}  // namespace trellis
