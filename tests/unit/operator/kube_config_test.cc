#include <stdlib.h>

#include <filesystem>
#include <fstream>

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
  EXPECT_EQ(c->ns, "ml");
}

TEST(KubeconfigTest, ClearErrors) {
  TempDir d;
  auto missing_ctx = KubeconfigFile(d.Write("a", "current-context: nope\ncontexts: []\n"));
  ASSERT_FALSE(missing_ctx.ok());
  EXPECT_NE(missing_ctx.status().message().find("current-context \"nope\" not found"), std::string::npos);
  auto certs = KubeconfigFile(d.Write("b", R"(current-context: x
contexts: [{name: x, context: {cluster: c, user: u}}]
clusters: [{name: c, cluster: {server: "https://s"}}]
users: [{name: u, user: {client-certificate: /c.pem}}]
)"));
  ASSERT_FALSE(certs.ok());
  EXPECT_NE(certs.status().message().find("only token authentication is supported"), std::string::npos);
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
