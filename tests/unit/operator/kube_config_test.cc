#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "operator/kube_client.h"

namespace trellis::op {
namespace {

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/trellis-kubecfg-XXXXXX";
    path_ = mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ + "/" + name) << text;
    return path_ + "/" + name;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(StatusFromHttpTest, MapsKubernetesAnswers) {
  auto body = [](const char* reason) { return *ParseJson(std::string(R"({"reason":")") + reason + R"(","message":"m"})"); };
  EXPECT_EQ(StatusFromHttp(404, body("NotFound")).code(), StatusCode::kNotFound);
  EXPECT_EQ(StatusFromHttp(409, body("AlreadyExists")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(StatusFromHttp(409, body("Conflict")).code(), StatusCode::kAborted);
  EXPECT_EQ(StatusFromHttp(410, body("Expired")).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(StatusFromHttp(403, body("Forbidden")).code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(StatusFromHttp(422, body("Invalid")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(StatusFromHttp(503, Json::object()).code(), StatusCode::kUnavailable);
  EXPECT_EQ(StatusFromHttp(429, body("TooManyRequests")).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(StatusFromHttp(409, body("Conflict")).message(), "HTTP 409 Conflict: m");
}

TEST(KubeconfigTest, CurrentContextServerCaTokenAndNamespace) {
  TempDir d;
  std::string tok = d.Write("tok", "file-token\n");
  std::string cfg = d.Write("config", R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: other
  cluster: {server: "https://wrong"}
- name: c1
  cluster: {server: "https://10.0.0.1:6443/", certificate-authority: /etc/ca.pem}
contexts:
- name: dev
  context: {cluster: c1, user: u1, namespace: ml}
users:
- name: u1
  user: {tokenFile: )" + tok + "}\n");
  auto c = KubeconfigFile(cfg);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server, "https://10.0.0.1:6443");
  EXPECT_EQ(c->ca_file, "/etc/ca.pem");
  EXPECT_EQ(c->token, "file-token");
  EXPECT_EQ(c->token_file, tok);  // read again later: a rotated token is picked up
  EXPECT_EQ(c->ns, "ml");
}

// Most admin kubeconfigs (kubeadm, kind, k3s) authenticate with a client certificate.
TEST(KubeconfigTest, ClientCertificatesAsFilesRelativeToTheKubeconfigOrInline) {
  TempDir d;
  const std::string gen = "cd " + d.path() +
                          " && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=admin -keyout a.key -out a.crt"
                          " 2>/dev/null && openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=b -keyout b.key"
                          " -out b.crt 2>/dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  auto read = [&](const std::string& f) {
    std::ifstream in(d.path() + "/" + f);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  auto b64 = [&](const std::string& f) {
    const std::string s = read(f);
    return utility::conversions::to_base64(std::vector<unsigned char>(s.begin(), s.end()));
  };
  auto config = [&](const std::string& user) {
    return "current-context: x\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
           "clusters: [{name: c, cluster: {server: \"https://s\", certificate-authority: ca.crt}}]\n"
           "users: [{name: u, user: " + user + "}]\n";
  };
  auto files = KubeconfigFile(d.Write("files", config("{client-certificate: a.crt, client-key: a.key}")));
  ASSERT_TRUE(files.ok()) << files.status().message();
  EXPECT_EQ(files->client_cert_pem, read("a.crt"));
  EXPECT_EQ(files->client_key_pem, read("a.key"));
  EXPECT_EQ(files->ca_file, d.path() + "/ca.crt");
  EXPECT_TRUE(files->token.empty());
  auto inline_data = KubeconfigFile(
      d.Write("data", config("{client-certificate-data: " + b64("a.crt") + ", client-key-data: " + b64("a.key") + "}")));
  ASSERT_TRUE(inline_data.ok()) << inline_data.status().message();
  EXPECT_EQ(inline_data->client_cert_pem, read("a.crt"));

  auto mismatched = KubeconfigFile(d.Write("mix", config("{client-certificate: a.crt, client-key: b.key}")));
  ASSERT_FALSE(mismatched.ok());
  EXPECT_NE(mismatched.status().message().find("does not belong to the client certificate"), std::string::npos)
      << mismatched.status().message();
  auto no_key = KubeconfigFile(d.Write("nokey", config("{client-certificate: a.crt}")));
  ASSERT_FALSE(no_key.ok());
  EXPECT_NE(no_key.status().message().find("needs its key"), std::string::npos) << no_key.status().message();
  auto not_pem = KubeconfigFile(d.Write("notpem", config("{client-certificate-data: aGVsbG8=, client-key-data: aGVsbG8=}")));
  ASSERT_FALSE(not_pem.ok());
  EXPECT_NE(not_pem.status().message().find("not a PEM certificate"), std::string::npos) << not_pem.status().message();
  auto absent = KubeconfigFile(d.Write("absent", config("{client-certificate: nope.crt, client-key: a.key}")));
  ASSERT_FALSE(absent.ok());
  EXPECT_NE(absent.status().message().find("nope.crt: cannot open"), std::string::npos) << absent.status().message();
}

TEST(KubeconfigTest, ClearErrors) {
  TempDir d;
  auto missing_ctx = KubeconfigFile(d.Write("a", "current-context: nope\ncontexts: []\n"));
  ASSERT_FALSE(missing_ctx.ok());
  EXPECT_NE(missing_ctx.status().message().find("current-context \"nope\" not found"), std::string::npos);
  auto certs = KubeconfigFile(d.Write("b", R"(current-context: x
contexts: [{name: x, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://s"}}]
users: [{name: u, user: {exec: {command: aws}}}]
)"));
  ASSERT_FALSE(certs.ok());
  EXPECT_NE(certs.status().message().find("exec plugin is not supported: use a token, tokenFile or a client certificate"),
            std::string::npos)
      << certs.status().message();
  auto garbage = KubeconfigFile(d.Write("c", "clusters: [unclosed\n"));
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("cannot read kubeconfig"), std::string::npos);
  EXPECT_FALSE(KubeconfigFile(d.path() + "/absent").ok());
}

TEST(InClusterConfigTest, ServiceAccountFilesAndEnvironment) {
  TempDir d;
  d.Write("token", "sa-token\n");
  d.Write("namespace", "trellis-system");
  unsetenv("KUBERNETES_SERVICE_HOST");
  auto none = InClusterConfig(d.path());
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not running in a cluster"), std::string::npos);
  setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  auto c = InClusterConfig(d.path());
  unsetenv("KUBERNETES_SERVICE_HOST");
  unsetenv("KUBERNETES_SERVICE_PORT");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->server, "https://10.96.0.1:443");
  EXPECT_EQ(c->token, "sa-token");
  EXPECT_EQ(c->ca_file, d.path() + "/ca.crt");
  EXPECT_EQ(c->ns, "trellis-system");
}

}  // namespace
}  // namespace trellis::op
