// A small Kubernetes REST client over cpprestsdk: the verbs the operator needs on the resources
// it uses, typed errors instead of exceptions, a deadline on every request, and watch streams.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <cpprest/http_client.h>

#include "common/base/mutex.h"
#include "common/base/status.h"
#include "operator/json_util.h"

namespace trellis::op {

struct KubeConfig {
  std::string server;        // "https://10.0.0.1:443" or "http://127.0.0.1:8080"
  std::string token;         // bearer token; empty: none
  // When set, the token is read from this file, and read again at most every `token_reload`
  // and after a 401 (as client-go does): bound service-account tokens expire and are rotated.
  std::string token_file;
  std::chrono::seconds token_reload{60};
  std::string ca_file;       // PEM bundle to verify the server; empty: system roots
  std::string ca_pem;        // or the PEM text itself (kubeconfig certificate-authority-data)
  // A client certificate and its key (PEM text), for clusters that authenticate users by
  // certificate (most admin kubeconfigs).
  std::string client_cert_pem;
  std::string client_key_pem;
  bool insecure_skip_verify = false;
  std::string ns = "default";  // the namespace of the operator itself (leases, events)
  // Sent with every request: the API server's logs and audit records name the operator by it.
  std::string user_agent = "trellis-operator";
};

// In a pod: KUBERNETES_SERVICE_HOST/PORT and the service-account token, CA and namespace under
// `sa_dir` (normally /var/run/secrets/kubernetes.io/serviceaccount).
StatusOr<KubeConfig> InClusterConfig(const std::string& sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount");
// Out of cluster: the current context of a kubeconfig file (server, certificate-authority or
// certificate-authority-data, insecure-skip-tls-verify; the user's token, tokenFile, or
// client-certificate + client-key / client-certificate-data + client-key-data). Relative paths
// are relative to the kubeconfig's folder, as kubectl reads them. Exec plugins and auth
// providers are not supported and named as such.
StatusOr<KubeConfig> KubeconfigFile(const std::string& path);
// Reads a client certificate and key (PEM files) into `c`, checking that they load and match.
Status LoadClientCertificate(KubeConfig& c, const std::string& cert_file, const std::string& key_file);
// Checks that `c`'s client certificate and key (PEM text) load and belong together.
Status CheckClientCertificate(const KubeConfig& c);

// A resource collection: "api/v1" + "pods", "apis/trellis.io/v1alpha1" + "trainingjobs".
struct Resource {
  std::string prefix;
  std::string plural;
};
inline const Resource kPods{"api/v1", "pods"};
inline const Resource kServices{"api/v1", "services"};
inline const Resource kSecrets{"api/v1", "secrets"};
inline const Resource kConfigMaps{"api/v1", "configmaps"};
inline const Resource kEvents{"api/v1", "events"};
inline const Resource kLeases{"apis/coordination.k8s.io/v1", "leases"};
inline const Resource kTrainingJobs{"apis/trellis.io/v1alpha1", "trainingjobs"};

// Error codes: 404 NOT_FOUND, 409 AlreadyExists ALREADY_EXISTS, 409 Conflict ABORTED,
// 410 Gone OUT_OF_RANGE, 401 UNAUTHENTICATED, 403 PERMISSION_DENIED, 422/400 INVALID_ARGUMENT,
// 429 RESOURCE_EXHAUSTED, transport errors and 5xx UNAVAILABLE. Messages carry the server's Status message.
class KubeClient {
 public:
  KubeClient(KubeConfig config, std::chrono::milliseconds request_timeout = std::chrono::seconds(10));

  StatusOr<Json> Get(const Resource& r, const std::string& ns, const std::string& name);
  // ns empty: every namespace. label_selector e.g. "trellis.io/job-name=mlp".
  StatusOr<Json> List(const Resource& r, const std::string& ns, const std::string& label_selector = "");
  StatusOr<Json> Create(const Resource& r, const std::string& ns, const Json& object);
  // PUT with the object's metadata.resourceVersion: ABORTED when someone changed it meanwhile.
  StatusOr<Json> Update(const Resource& r, const std::string& ns, const std::string& name, const Json& object);
  StatusOr<Json> UpdateStatus(const Resource& r, const std::string& ns, const std::string& name, const Json& object);
  // JSON merge patch (tests use it to play the kubelet).
  StatusOr<Json> MergePatch(const Resource& r, const std::string& ns, const std::string& name, const Json& patch,
                            bool status = false);
  Status Delete(const Resource& r, const std::string& ns, const std::string& name);

  // Streams events from `resource_version` until the server ends the stream (OK), the stream
  // breaks (UNAVAILABLE), the version is too old (OUT_OF_RANGE: relist), or `cancel` fires
  // (CANCELLED). `on_event(type, object)` sees ADDED, MODIFIED, DELETED and BOOKMARK.
  Status Watch(const Resource& r, const std::string& ns, const std::string& label_selector,
               const std::string& resource_version, int timeout_seconds,
               const std::function<void(const std::string& type, const Json& object)>& on_event,
               const pplx::cancellation_token& cancel);

  // Requests that failed (any error but NOT_FOUND / ALREADY_EXISTS, which are answers).
  uint64_t api_errors() const { return api_errors_.load(); }
  // Requests made so far by (verb, resource): verbs as the API server's apiserver_request_total
  // counts them (GET, LIST, WATCH, POST, PUT, PATCH, DELETE), "trainingjobs/status" for the
  // status subresource.
  std::map<std::pair<std::string, std::string>, uint64_t> RequestCounts() const EXCLUDES(count_mu_);

  // False once every request for `window` has been refused (401, 403) or has not reached the
  // API server (transport errors, 5xx): the operator's /healthz, so the kubelet restarts a
  // replica whose credentials stopped working. Any other answer resets it.
  bool Healthy(std::chrono::seconds window) const EXCLUDES(health_mu_);
  // The last such error, for the log; empty while healthy.
  std::string LastFailure() const EXCLUDES(health_mu_);

 private:
  std::string Path(const Resource& r, const std::string& ns, const std::string& name,
                   const std::string& sub = "") const;
  StatusOr<Json> Request(const web::http::method& m, const std::string& path_and_query, const Json* body,
                         const std::string& content_type = "application/json");
  StatusOr<Json> RequestOnce(const web::http::method& m, const std::string& path_and_query, const Json* body,
                             const std::string& content_type);
  Status Fail(Status s);
  void Count(const char* verb, const Resource& r, const char* sub = "") EXCLUDES(count_mu_);
  // Counts `s` (OK or an error) for Healthy().
  void Observe(const Status& s) EXCLUDES(health_mu_);
  // The bearer token now, re-read from config_.token_file when due (or when `force`). Returns
  // whether a forced re-read found a different token.
  std::string Token() EXCLUDES(token_mu_);
  bool ReloadToken() EXCLUDES(token_mu_);

  KubeConfig config_;
  mutable Mutex token_mu_;
  std::string token_ GUARDED_BY(token_mu_);
  std::chrono::steady_clock::time_point token_read_ GUARDED_BY(token_mu_);
  mutable Mutex health_mu_;
  std::optional<std::chrono::steady_clock::time_point> failing_since_ GUARDED_BY(health_mu_);
  std::string last_failure_ GUARDED_BY(health_mu_);
  std::unique_ptr<web::http::client::http_client> client_;        // requests, with the deadline
  std::unique_ptr<web::http::client::http_client> watch_client_;  // long-lived streams
  std::atomic<uint64_t> api_errors_{0};
  mutable Mutex count_mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_ GUARDED_BY(count_mu_);
};

// The Status an HTTP answer maps to (exposed for tests).
Status StatusFromHttp(int http_code, const Json& body);

}  // namespace trellis::op
