#include "operator/kube_client.h"

#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>

#include <boost/asio/ssl.hpp>
#include <cpprest/containerstream.h>
#include <yaml-cpp/yaml.h>

namespace trellis::op {
namespace {

using web::http::methods;
using web::http::client::http_client;
using web::http::client::http_client_config;

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Encode(const std::string& s) { return web::uri::encode_data_string(s); }

// Loads the client certificate chain and key into `ctx`; an error names what did not load.
Status UseClientCertificate(boost::asio::ssl::context& ctx, const std::string& cert, const std::string& key) {
  boost::system::error_code ec;
  ctx.use_certificate_chain(boost::asio::buffer(cert.data(), cert.size()), ec);
  if (ec) return InvalidArgumentError("client certificate: not a PEM certificate: " + ec.message());
  ctx.use_private_key(boost::asio::buffer(key.data(), key.size()), boost::asio::ssl::context::pem, ec);
  // OpenSSL checks the pair as it loads the key ("key values mismatch").
  if (ec && ec.message().find("mismatch") != std::string::npos) {
    return InvalidArgumentError("client key: does not belong to the client certificate");
  }
  if (ec) return InvalidArgumentError("client key: not a PEM private key: " + ec.message());
  if (SSL_CTX_check_private_key(ctx.native_handle()) != 1) {
    return InvalidArgumentError("client key: does not belong to the client certificate");
  }
  return Status::Ok();
}

http_client_config ClientConfig(const KubeConfig& c, std::chrono::milliseconds timeout) {
  http_client_config cfg;
  cfg.set_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  if (c.insecure_skip_verify) cfg.set_validate_certificates(false);
  if (!c.ca_file.empty() || !c.ca_pem.empty() || !c.client_cert_pem.empty()) {
    std::string file = c.ca_file, pem = c.ca_pem, cert = c.client_cert_pem, key = c.client_key_pem;
    cfg.set_ssl_context_callback([file, pem, cert, key](boost::asio::ssl::context& ctx) {
      boost::system::error_code ec;  // a bad CA fails the handshake, reported as UNAVAILABLE
      if (!file.empty()) ctx.load_verify_file(file, ec);
      if (!pem.empty()) ctx.add_certificate_authority(boost::asio::buffer(pem.data(), pem.size()), ec);
      // Checked when the configuration was read (CheckClientCertificate).
      if (!cert.empty()) (void)UseClientCertificate(ctx, cert, key);
    });
  }
  return cfg;
}

// A path in a kubeconfig, relative to the kubeconfig's folder unless absolute.
std::string Resolve(const std::string& kubeconfig, const std::string& p) {
  if (p.empty() || p[0] == '/') return p;
  const size_t slash = kubeconfig.rfind('/');
  return slash == std::string::npos ? p : kubeconfig.substr(0, slash + 1) + p;
}

StatusOr<std::string> Base64Pem(const std::string& what, const std::string& b64) {
  auto bytes = utility::conversions::from_base64(b64);
  if (bytes.empty()) return InvalidArgumentError(what + " is not valid base64");
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

Status CheckClientCertificate(const KubeConfig& c) {
  if (c.client_cert_pem.empty() && c.client_key_pem.empty()) return Status::Ok();
  if (c.client_cert_pem.empty()) return InvalidArgumentError("a client key without a client certificate");
  if (c.client_key_pem.empty()) return InvalidArgumentError("a client certificate without its client key");
  try {
    boost::asio::ssl::context ctx(boost::asio::ssl::context::tls_client);
    return UseClientCertificate(ctx, c.client_cert_pem, c.client_key_pem);
  } catch (const std::exception& e) {
    return InvalidArgumentError(std::string("client certificate: ") + e.what());
  }
}

Status LoadClientCertificate(KubeConfig& c, const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return InvalidArgumentError("a client certificate needs its key (and a key its certificate)");
  }
  if (cert_file.empty()) return Status::Ok();
  TRELLIS_ASSIGN_OR_RETURN(c.client_cert_pem, ReadFile(cert_file));
  TRELLIS_ASSIGN_OR_RETURN(c.client_key_pem, ReadFile(key_file));
  return CheckClientCertificate(c).Annotate(cert_file + ", " + key_file);
}

StatusOr<KubeConfig> InClusterConfig(const std::string& sa_dir) {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (!host || !*host || !port || !*port) {
    return FailedPreconditionError(
        "not running in a cluster: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set "
        "(use --kubeconfig or --server)");
  }
  KubeConfig c;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  c.server = "https://" + h + ":" + port;
  TRELLIS_ASSIGN_OR_RETURN(std::string token, ReadFile(sa_dir + "/token"));
  c.token = Trim(token);
  c.token_file = sa_dir + "/token";  // the kubelet rotates it: read it again
  c.ca_file = sa_dir + "/ca.crt";
  if (auto ns = ReadFile(sa_dir + "/namespace"); ns.ok()) c.ns = Trim(*ns);
  return c;
}

StatusOr<KubeConfig> KubeconfigFile(const std::string& path) {
  try {
    YAML::Node root = YAML::LoadFile(path);
    const std::string current = root["current-context"] ? root["current-context"].as<std::string>() : "";
    auto find = [&](const char* list, const std::string& name) -> YAML::Node {
      for (const auto& item : root[list]) {
        if (item["name"] && item["name"].as<std::string>() == name) return item;
      }
      return YAML::Node();
    };
    YAML::Node ctx = find("contexts", current)["context"];
    if (!ctx) return InvalidArgumentError(path + ": current-context \"" + current + "\" not found in contexts");
    KubeConfig c;
    if (ctx["namespace"]) c.ns = ctx["namespace"].as<std::string>();
    YAML::Node cluster = find("clusters", ctx["cluster"].as<std::string>(""))["cluster"];
    if (!cluster || !cluster["server"]) return InvalidArgumentError(path + ": the context's cluster has no server");
    c.server = cluster["server"].as<std::string>();
    if (cluster["certificate-authority"]) c.ca_file = Resolve(path, cluster["certificate-authority"].as<std::string>());
    if (cluster["insecure-skip-tls-verify"]) c.insecure_skip_verify = cluster["insecure-skip-tls-verify"].as<bool>();
    if (cluster["certificate-authority-data"]) {
      auto pem = utility::conversions::from_base64(cluster["certificate-authority-data"].as<std::string>());
      if (pem.empty()) return InvalidArgumentError(path + ": certificate-authority-data is not valid base64");
      c.ca_pem.assign(pem.begin(), pem.end());
    }
    YAML::Node user = find("users", ctx["user"].as<std::string>(""))["user"];
    auto field = [&](const char* k) { return user && user[k] ? user[k].as<std::string>() : std::string(); };
    if (user && (user["exec"] || user["auth-provider"])) {
      return UnimplementedError(path + ": the user's " + (user["exec"] ? "exec plugin" : "auth-provider") +
                                " is not supported: use a token, tokenFile or a client certificate");
    }
    if (!field("token").empty()) {
      c.token = field("token");
    } else if (!field("tokenFile").empty()) {
      c.token_file = Resolve(path, field("tokenFile"));
      TRELLIS_ASSIGN_OR_RETURN(std::string t, ReadFile(c.token_file));
      c.token = Trim(t);
    }
    if (!field("client-certificate-data").empty() || !field("client-key-data").empty()) {
      TRELLIS_ASSIGN_OR_RETURN(c.client_cert_pem, Base64Pem("client-certificate-data", field("client-certificate-data")));
      TRELLIS_ASSIGN_OR_RETURN(c.client_key_pem, Base64Pem("client-key-data", field("client-key-data")));
      TRELLIS_RETURN_IF_ERROR(CheckClientCertificate(c).Annotate(path));
    } else if (!field("client-certificate").empty() || !field("client-key").empty()) {
      TRELLIS_RETURN_IF_ERROR(LoadClientCertificate(c, Resolve(path, field("client-certificate")),
                                                    Resolve(path, field("client-key")))
                                  .Annotate(path));
    }
    while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
    return c;
  } catch (const std::exception& e) {
    return InvalidArgumentError(path + ": cannot read kubeconfig: " + e.what());
  }
}

Status StatusFromHttp(int code, const Json& body) {
  std::string msg = Str(body, {"message"});
  const std::string reason = Str(body, {"reason"});
  if (msg.empty()) msg = "HTTP " + std::to_string(code);
  msg = "HTTP " + std::to_string(code) + (reason.empty() ? "" : " " + reason) + ": " + msg;
  switch (code) {
    case 400:
    case 422: return InvalidArgumentError(msg);
    case 401: return UnauthenticatedError(msg);
    case 403: return PermissionDeniedError(msg);
    case 404: return NotFoundError(msg);
    case 409: return reason == "AlreadyExists" ? AlreadyExistsError(msg) : AbortedError(msg);
    case 410: return OutOfRangeError(msg);
    case 429: return ResourceExhaustedError(msg);
    default: return code >= 500 ? UnavailableError(msg) : Status(StatusCode::kUnknown, msg);
  }
}

KubeClient::KubeClient(KubeConfig config, std::chrono::milliseconds request_timeout) : config_(std::move(config)) {
  token_ = config_.token;
  token_read_ = std::chrono::steady_clock::now();
  client_ = std::make_unique<http_client>(config_.server, ClientConfig(config_, request_timeout));
  // A watch lasts up to its timeoutSeconds; the client-side limit is only a backstop.
  watch_client_ = std::make_unique<http_client>(config_.server, ClientConfig(config_, std::chrono::hours(1)));
}

std::string KubeClient::Path(const Resource& r, const std::string& ns, const std::string& name,
                             const std::string& sub) const {
  std::string p = "/" + r.prefix;
  if (!ns.empty()) p += "/namespaces/" + Encode(ns);
  p += "/" + r.plural;
  if (!name.empty()) p += "/" + Encode(name);
  if (!sub.empty()) p += "/" + sub;
  return p;
}

void KubeClient::Count(const char* verb, const Resource& r, const char* sub) {
  MutexLock lock(&count_mu_);
  ++requests_[{verb, *sub ? r.plural + "/" + sub : r.plural}];
}

std::map<std::pair<std::string, std::string>, uint64_t> KubeClient::RequestCounts() const {
  MutexLock lock(&count_mu_);
  return requests_;
}

Status KubeClient::Fail(Status s) {
  if (s.code() != StatusCode::kNotFound && s.code() != StatusCode::kAlreadyExists) ++api_errors_;
  return s;
}

void KubeClient::Observe(const Status& s) {
  const bool refused = s.code() == StatusCode::kUnauthenticated || s.code() == StatusCode::kPermissionDenied ||
                       s.code() == StatusCode::kUnavailable;
  MutexLock lock(&health_mu_);
  if (!refused) {
    failing_since_.reset();
    last_failure_.clear();
    return;
  }
  if (!failing_since_) failing_since_ = std::chrono::steady_clock::now();
  last_failure_ = s.message();
}

bool KubeClient::Healthy(std::chrono::seconds window) const {
  MutexLock lock(&health_mu_);
  return !failing_since_ || std::chrono::steady_clock::now() - *failing_since_ < window;
}

std::string KubeClient::LastFailure() const {
  MutexLock lock(&health_mu_);
  return last_failure_;
}

std::string KubeClient::Token() {
  MutexLock lock(&token_mu_);
  if (!config_.token_file.empty() && std::chrono::steady_clock::now() - token_read_ >= config_.token_reload) {
    token_read_ = std::chrono::steady_clock::now();
    // An unreadable file (mid-rotation) keeps the token we have.
    if (auto t = ReadFile(config_.token_file); t.ok() && !Trim(*t).empty()) token_ = Trim(*t);
  }
  return token_;
}

bool KubeClient::ReloadToken() {
  if (config_.token_file.empty()) return false;
  MutexLock lock(&token_mu_);
  token_read_ = std::chrono::steady_clock::now();
  auto t = ReadFile(config_.token_file);
  if (!t.ok() || Trim(*t).empty() || Trim(*t) == token_) return false;
  token_ = Trim(*t);
  return true;
}

StatusOr<Json> KubeClient::Request(const web::http::method& m, const std::string& path, const Json* body,
                                   const std::string& content_type) {
  auto r = RequestOnce(m, path, body, content_type);
  // 401: the token may have been rotated (or expired) on disk since we read it; retry once with
  // the new one.
  if (!r.ok() && r.status().code() == StatusCode::kUnauthenticated && ReloadToken()) {
    r = RequestOnce(m, path, body, content_type);
  }
  Observe(r.status());
  return r;
}

StatusOr<Json> KubeClient::RequestOnce(const web::http::method& m, const std::string& path, const Json* body,
                                       const std::string& content_type) {
  try {
    web::http::http_request req(m);
    req.set_request_uri(path);
    if (const std::string token = Token(); !token.empty()) req.headers().add("Authorization", "Bearer " + token);
    if (!config_.user_agent.empty()) req.headers().add("User-Agent", config_.user_agent);
    req.headers().add("Accept", "application/json");
    if (body) req.set_body(body->serialize(), content_type);
    web::http::http_response resp = client_->request(req).get();
    const std::string text = resp.extract_string(true).get();
    std::string err;
    std::optional<Json> j = text.empty() ? Json::object() : ParseJson(text, &err);
    const int code = resp.status_code();
    if (code >= 200 && code < 300) {
      if (!j) return Fail(UnavailableError(m + " " + path + ": bad JSON from the API server: " + err));
      return *j;
    }
    return Fail(StatusFromHttp(code, j.value_or(Json::object())).Annotate(m + " " + path));
  } catch (const std::exception& e) {
    return Fail(UnavailableError(m + " " + path + ": " + e.what()));
  }
}

StatusOr<Json> KubeClient::Get(const Resource& r, const std::string& ns, const std::string& name) {
  Count("GET", r);
  return Request(methods::GET, Path(r, ns, name), nullptr);
}

StatusOr<Json> KubeClient::List(const Resource& r, const std::string& ns, const std::string& selector) {
  Count("LIST", r);
  std::string p = Path(r, ns, "");
  if (!selector.empty()) p += "?labelSelector=" + Encode(selector);
  return Request(methods::GET, p, nullptr);
}

StatusOr<Json> KubeClient::Create(const Resource& r, const std::string& ns, const Json& object) {
  Count("POST", r);
  return Request(methods::POST, Path(r, ns, ""), &object);
}

StatusOr<Json> KubeClient::Update(const Resource& r, const std::string& ns, const std::string& name,
                                  const Json& object) {
  Count("PUT", r);
  return Request(methods::PUT, Path(r, ns, name), &object);
}

StatusOr<Json> KubeClient::UpdateStatus(const Resource& r, const std::string& ns, const std::string& name,
                                        const Json& object) {
  Count("PUT", r, "status");
  return Request(methods::PUT, Path(r, ns, name, "status"), &object);
}

StatusOr<Json> KubeClient::MergePatch(const Resource& r, const std::string& ns, const std::string& name,
                                      const Json& patch, bool status) {
  Count("PATCH", r, status ? "status" : "");
  return Request(methods::PATCH, Path(r, ns, name, status ? "status" : ""), &patch,
                 "application/merge-patch+json");
}

Status KubeClient::Delete(const Resource& r, const std::string& ns, const std::string& name) {
  // Background propagation: the garbage collector deletes what the object owns.
  Json opts = *ParseJson(R"({"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"})");
  Count("DELETE", r);
  auto s = Request(methods::DEL, Path(r, ns, name), &opts);
  return s.ok() ? Status::Ok() : s.status();
}

Status KubeClient::Watch(const Resource& r, const std::string& ns, const std::string& selector,
                         const std::string& rv, int timeout_seconds,
                         const std::function<void(const std::string&, const Json&)>& on_event,
                         const pplx::cancellation_token& cancel) {
  std::string p = Path(r, ns, "") + "?watch=true&allowWatchBookmarks=true&resourceVersion=" + Encode(rv) +
                  "&timeoutSeconds=" + std::to_string(timeout_seconds);
  if (!selector.empty()) p += "&labelSelector=" + Encode(selector);
  Count("WATCH", r);
  try {
    web::http::http_request req(methods::GET);
    req.set_request_uri(p);
    if (const std::string token = Token(); !token.empty()) req.headers().add("Authorization", "Bearer " + token);
    if (!config_.user_agent.empty()) req.headers().add("User-Agent", config_.user_agent);
    web::http::http_response resp = watch_client_->request(req, cancel).get();
    if (resp.status_code() != 200) {
      std::string err;
      auto body = ParseJson(resp.extract_string(true).get(), &err);
      Status s = StatusFromHttp(resp.status_code(), body.value_or(Json::object())).Annotate("watch " + p);
      if (s.code() == StatusCode::kUnauthenticated) ReloadToken();  // the caller's retry uses it
      Observe(s);
      return Fail(s);
    }
    Observe(Status::Ok());
    concurrency::streams::istream in = resp.body();
    while (true) {
      if (cancel.is_canceled()) return CancelledError("watch cancelled");
      concurrency::streams::container_buffer<std::string> line;
      size_t n = in.read_line(line).get();
      if (n == 0 && in.is_eof()) return Status::Ok();  // the server ended the stream (timeoutSeconds)
      if (line.collection().empty()) continue;
      std::string err;
      auto ev = ParseJson(line.collection(), &err);
      if (!ev) return Fail(UnavailableError("watch " + p + ": bad event JSON: " + err));
      const std::string type = Str(*ev, {"type"});
      const Json* obj = At(*ev, {"object"});
      if (type == "ERROR") {
        const int code = static_cast<int>(obj ? Int(*obj, {"code"}).value_or(500) : 500);
        return Fail(StatusFromHttp(code, obj ? *obj : Json::object()).Annotate("watch " + p));
      }
      if (!obj) continue;
      on_event(type, *obj);
    }
  } catch (const std::exception& e) {
    if (cancel.is_canceled()) return CancelledError("watch cancelled");
    Status s = UnavailableError("watch " + p + ": " + e.what());
    Observe(s);
    return Fail(s);
  }
}

}  // namespace trellis::op
