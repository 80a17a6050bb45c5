// The in-cluster path: HTTPS verified against a CA file, and a bearer token.
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "common/config/env.h"
#include "tests/integration/operator/double_fixture.h"

namespace trellis::op::testing {
namespace {

class TlsTest : public DoubleTest {
 protected:
  std::vector<std::string> DoubleArgs() override {
    // A self-signed certificate for 127.0.0.1, made fresh for the test.
    SpawnOptions o;
    o.argv = {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
              "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", dir_ + "/key.pem", "-out", dir_ + "/cert.pem"};
    o.env = CurrentEnvironment();
    o.stdout_mode = SpawnOptions::Output::kNull;
    o.stderr_mode = SpawnOptions::Output::kNull;
    auto p = Subprocess::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().message();
    if (p.ok()) {
      auto exit = (*p)->WaitFor(std::chrono::seconds(30));
      EXPECT_TRUE(exit && exit->ok()) << "openssl failed";
    }
    return {"--tls-cert", dir_ + "/cert.pem", "--tls-key", dir_ + "/key.pem", "--token", "sa-token"};
  }
  KubeConfig ClientConfig(const std::string& port) override {
    KubeConfig c;
    c.server = "https://127.0.0.1:" + port;
    c.ca_file = dir_ + "/cert.pem";
    c.token = "sa-token";
    return c;
  }
};

TEST_F(TlsTest, VerifiedWithTheCaAndAuthenticatedWithTheToken) {
  auto ok = client_->List(kTrainingJobs, "");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(Str(*ok, {"kind"}), "TrainingJobList");

  KubeConfig no_token = ClientConfig(server_.substr(server_.rfind(':') + 1));
  no_token.token.clear();
  auto denied = KubeClient(no_token).List(kTrainingJobs, "");
  EXPECT_EQ(denied.status().code(), StatusCode::kUnauthenticated) << denied.status().message();

  // The CA as kubeconfig carries it: certificate-authority-data (base64 PEM).
  {
    std::ifstream in(dir_ + "/cert.pem");
    std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir_ + "/kubeconfig")
        << "current-context: t\ncontexts: [{name: t, context: {cluster: c, user: u}}]\n"
        << "clusters: [{name: c, cluster: {server: \"" << server_ << "\", certificate-authority-data: "
        << utility::conversions::to_base64(std::vector<unsigned char>(pem.begin(), pem.end())) << "}}]\n"
        << "users: [{name: u, user: {token: sa-token}}]\n";
    auto cfg = KubeconfigFile(dir_ + "/kubeconfig");
    ASSERT_TRUE(cfg.ok()) << cfg.status().message();
    auto listed = KubeClient(*cfg).List(kTrainingJobs, "");
    EXPECT_TRUE(listed.ok()) << listed.status().message();
  }

  KubeConfig no_ca = ClientConfig(server_.substr(server_.rfind(':') + 1));
  no_ca.ca_file.clear();  // system roots do not know the test's certificate
  auto untrusted = KubeClient(no_ca).List(kTrainingJobs, "");
  EXPECT_EQ(untrusted.status().code(), StatusCode::kUnavailable) << "an unverified server was trusted";
}

}  // namespace
}  // namespace trellis::op::testing
