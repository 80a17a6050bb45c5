// Credentials out of cluster and over time, against the API double: client certificates (the
// double requires one signed by its CA), the --server CA and certificate flags, and a bearer
// token rotated on disk while the operator runs (/healthz says when the server keeps refusing).
#include <csignal>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include <cpprest/http_client.h>

#include "common/config/env.h"
#include "common/base/net.h"
#include "tests/integration/operator/double_fixture.h"

namespace trellis::op::testing {
namespace {

using std::chrono::seconds;

bool RunShell(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kNull;
  o.stderr_mode = SpawnOptions::Output::kNull;
  auto p = Subprocess::Start(o);
  if (!p.ok()) return false;
  auto exit = (*p)->WaitFor(seconds(60));
  return exit && exit->ok();
}

// An operator binary with the given flags (and its own metrics port), logging to dir/<log>.
struct OperatorProcess {
  std::unique_ptr<Subprocess> process;
  int port = 0;
  std::pair<int, std::string> Get(const std::string& path) const {
    try {
      web::http::client::http_client http("http://127.0.0.1:" + std::to_string(port));
      auto r = http.request(web::http::methods::GET, path).get();
      return {r.status_code(), r.extract_string(true).get()};
    } catch (const std::exception&) {
      return {0, ""};
    }
  }
};

OperatorProcess StartOperator(const std::string& dir, const std::string& log, std::vector<std::string> flags) {
  OperatorProcess op;
  auto port = PickFreePort("127.0.0.1");
  EXPECT_TRUE(port.ok());
  op.port = port.ok() ? *port : 0;
  SpawnOptions o;
  o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-operator", "--metrics-host", "127.0.0.1", "--metrics-port",
            std::to_string(op.port)};
  o.argv.insert(o.argv.end(), flags.begin(), flags.end());
  o.env = CurrentEnvironment();
  o.stdout_mode = SpawnOptions::Output::kFile;
  o.stdout_path = dir + "/" + log;
  o.stderr_mode = SpawnOptions::Output::kStdout;
  auto p = Subprocess::Start(o);
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (p.ok()) op.process = std::move(*p);
  return op;
}

class ClientCertificateTest : public DoubleTest {
 protected:
  std::vector<std::string> DoubleArgs() override {
    // A CA, the server's certificate for 127.0.0.1 and an admin client certificate, both signed by it.
    const std::string script =
        "set -e; cd " + dir_ +
        "; openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca -keyout ca.key -out ca.crt"
        "; echo subjectAltName=IP:127.0.0.1 > san.ext"
        "; openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr"
        "; openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -extfile san.ext"
        " -out server.crt"
        "; openssl req -newkey rsa:2048 -nodes -subj /O=system:masters/CN=admin -keyout admin.key -out admin.csr"
        "; openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 -out admin.crt";
    EXPECT_TRUE(RunShell(script)) << "openssl failed";
    return {"--tls-cert", dir_ + "/server.crt", "--tls-key", dir_ + "/server.key", "--client-ca", dir_ + "/ca.crt"};
  }
  KubeConfig ClientConfig(const std::string& port) override {
    KubeConfig c;
    c.server = "https://127.0.0.1:" + port;
    c.ca_file = dir_ + "/ca.crt";
    EXPECT_TRUE(LoadClientCertificate(c, dir_ + "/admin.crt", dir_ + "/admin.key").ok());
    return c;
  }
};

TEST_F(ClientCertificateTest, AdminKubeconfigWithClientCertificateWorks) {
  auto listed = client_->List(kTrainingJobs, "");
  ASSERT_TRUE(listed.ok()) << listed.status().message();

  // kubectl's layout: paths relative to the kubeconfig.
  std::ofstream(dir_ + "/kubeconfig") << "apiVersion: v1\nkind: Config\ncurrent-context: admin@test\n"
                                      << "contexts: [{name: admin@test, context: {cluster: test, user: admin}}]\n"
                                      << "clusters: [{name: test, cluster: {server: \"" << server_
                                      << "\", certificate-authority: ca.crt}}]\n"
                                      << "users: [{name: admin, user: {client-certificate: admin.crt, "
                                         "client-key: admin.key}}]\n";
  auto cfg = KubeconfigFile(dir_ + "/kubeconfig");
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  EXPECT_TRUE(KubeClient(*cfg).List(kTrainingJobs, "").ok());

  KubeConfig anonymous = *cfg;
  anonymous.client_cert_pem.clear();
  anonymous.client_key_pem.clear();
  auto refused = KubeClient(anonymous).List(kTrainingJobs, "");
  EXPECT_FALSE(refused.ok()) << "the double let a client without a certificate in";
}

TEST_F(ClientCertificateTest, OperatorWithKubeconfigAndWithServerFlagsReconciles) {
  std::ofstream(dir_ + "/kubeconfig") << "current-context: a\ncontexts: [{name: a, context: {cluster: t, user: a}}]\n"
                                      << "clusters: [{name: t, cluster: {server: \"" << server_
                                      << "\", certificate-authority: " << dir_ << "/ca.crt}}]\n"
                                      << "users: [{name: a, user: {client-certificate: admin.crt, client-key: admin.key}}]\n";
  int n = 0;
  for (const std::vector<std::string>& how :
       {std::vector<std::string>{"--kubeconfig", dir_ + "/kubeconfig"},
        std::vector<std::string>{"--server", server_, "--certificate-authority", dir_ + "/ca.crt",
                                 "--client-certificate", dir_ + "/admin.crt", "--client-key", dir_ + "/admin.key"}}) {
    OperatorProcess op = StartOperator(dir_, "operator-" + std::to_string(n) + ".log", how);
    ASSERT_TRUE(op.process);
    const std::string job = "cert" + std::to_string(n++);
    CreateJob(job, R"({"workers":{"command":["w"]}})");
    EXPECT_TRUE(WaitFor([&] { return Str(GetJob(job), {"status", "phase"}) == "Pending"; }, seconds(20)))
        << how[0] << ": the operator did not reconcile; see " << dir_;
    EXPECT_TRUE(WaitFor([&] { return op.Get("/healthz").first == 200; }, seconds(10)));
    ASSERT_TRUE(op.process->Signal(SIGTERM).ok());
    EXPECT_TRUE(op.process->WaitFor(seconds(10)).has_value());
  }
}

class TokenRotationTest : public DoubleTest {
 protected:
  std::vector<std::string> DoubleArgs() override { return {"--token", "token-1"}; }
  KubeConfig ClientConfig(const std::string& port) override {
    KubeConfig c;
    c.server = "http://127.0.0.1:" + port;
    c.token = "token-1";
    return c;
  }
};

// A bound service-account token expires or is rotated: the operator reads the file again after
// a 401 and recovers; while the server keeps refusing, /healthz fails so the kubelet would
// restart it.
TEST_F(TokenRotationTest, RotatedTokenIsPickedUpAndHealthzFailsWhileRefused) {
  const std::string token_file = dir_ + "/token";
  std::ofstream(token_file) << "token-1\n";
  OperatorProcess op =
      StartOperator(dir_, "operator.log", {"--server", server_, "--token-file", token_file, "--api-unhealthy-seconds", "2"});
  ASSERT_TRUE(op.process);
  ASSERT_TRUE(WaitFor([&] { return op.Get("/healthz").first == 200; }, seconds(20)));
  CreateJob("before", R"({"workers":{"command":["w"]}})");
  ASSERT_TRUE(WaitFor([&] { return !Str(GetJob("before"), {"status", "phase"}).empty(); }, seconds(20)));

  // The server stops accepting token-1 (expired) and the file still holds it: refused.
  Hook("token?value=token-2");
  KubeConfig c2;  // the test's own client follows
  c2.server = server_;
  c2.token = "token-2";
  client_ = std::make_unique<KubeClient>(c2);
  Hook("break-watches");  // the operator has to call the server again: its relists get 401
  CreateJob("during", R"({"workers":{"command":["w"]}})");
  EXPECT_TRUE(WaitFor([&] { return op.Get("/healthz").first == 503; }, seconds(30)))
      << "/healthz kept saying 200 while every request was refused";

  // The kubelet writes the new token: the next 401 makes the operator read it, and it recovers.
  std::ofstream(token_file + ".tmp") << "token-2\n";
  std::rename((token_file + ".tmp").c_str(), token_file.c_str());
  EXPECT_TRUE(WaitFor([&] { return op.Get("/healthz").first == 200; }, seconds(45)));
  EXPECT_TRUE(WaitFor([&] { return !Str(GetJob("during"), {"status", "phase"}).empty(); }, seconds(45)))
      << "the operator did not reconcile with the rotated token; see " << dir_;
  ASSERT_TRUE(op.process->Signal(SIGTERM).ok());
  EXPECT_TRUE(op.process->WaitFor(seconds(10)).has_value());
}

}  // namespace
}  // namespace trellis::op::testing
