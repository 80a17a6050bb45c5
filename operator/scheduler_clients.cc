#include "operator/scheduler_clients.h"

#include <fstream>
#include <sstream>
#include <vector>

#include <cpprest/asyncrt_utils.h>

#include "common/tls/tls.h"

namespace trellis::op {
namespace {

StatusOr<std::string> Base64(const std::string& secret, const std::string& key, const std::string& b64) {
  try {
    const std::vector<unsigned char> raw = utility::conversions::from_base64(b64);
    return std::string(raw.begin(), raw.end());
  } catch (const std::exception& e) {
    return InvalidArgumentError("secret " + secret + ": " + key + ": bad base64: " + e.what());
  }
}

}  // namespace

SchedulerClients::SchedulerClients(KubeClient& client, OperatorSettings settings, std::string addresses_file)
    : client_(client), settings_(std::move(settings)), addresses_file_(std::move(addresses_file)) {}

StatusOr<std::string> SchedulerClients::Address(const std::string& ns, const std::string& name) const {
  const std::string service = ServiceName(name) + ":" + std::to_string(settings_.scheduler_port);
  if (addresses_file_.empty()) {
    return ServiceName(name) + "." + ns + ".svc:" + std::to_string(settings_.scheduler_port);
  }
  std::ifstream in(addresses_file_);
  if (!in) return NotFoundError(addresses_file_ + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  std::string error;
  auto map = ParseJson(text.str(), &error);
  if (!map) return InvalidArgumentError(addresses_file_ + ": " + error);
  std::string addr = Str(*map, {(ns + "/" + service).c_str()});
  if (addr.empty()) return NotFoundError("no address for " + ns + "/" + service);
  return addr;
}

StatusOr<std::shared_ptr<SchedulerClient>> SchedulerClients::For(const Json& job) {
  const std::string ns = Str(job, {"metadata", "namespace"}, "default");
  const std::string name = Str(job, {"metadata", "name"});
  const std::string uid = Str(job, {"metadata", "uid"});
  TRELLIS_ASSIGN_OR_RETURN(std::string address, Address(ns, name));
  {
    MutexLock lock(&mu_);
    auto it = kept_.find({ns, name});
    if (it != kept_.end() && it->second.uid == uid && it->second.address == address) return it->second.client;
  }
  // Secrets are read outside the lock: the poller and the reconciler do not wait on each other.
  TRELLIS_ASSIGN_OR_RETURN(std::shared_ptr<SchedulerClient> c, Connect(ns, name, address, job));
  MutexLock lock(&mu_);
  kept_[{ns, name}] = Kept{uid, address, c};
  return c;
}

StatusOr<std::shared_ptr<SchedulerClient>> SchedulerClients::Connect(const std::string& ns, const std::string& name,
                                                                     const std::string& address, const Json& job) {
  TRELLIS_ASSIGN_OR_RETURN(Json secret, client_.Get(kSecrets, ns, TokenSecretName(name)));
  std::string token = Str(secret, {"stringData", "token"});
  if (token.empty()) {
    TRELLIS_ASSIGN_OR_RETURN(token, Base64(TokenSecretName(name), "token", Str(secret, {"data", "token"})));
  }
  if (token.empty()) return NotFoundError("secret " + TokenSecretName(name) + " holds no token");
  SchedulerClientOptions o;
  o.address = address;
  o.token = token;
  o.rpc_timeout = std::chrono::milliseconds(2000);  // one slow job must not hold up the others
  const std::string tls_secret = Str(job, {"spec", "tls", "secretName"});
  if (!tls_secret.empty()) {
    // A TLS job's scheduler takes only clients with the job's certificate: the operator presents
    // the one in the job's Secret, as its pods do.
    TRELLIS_ASSIGN_OR_RETURN(Json certs, client_.Get(kSecrets, ns, tls_secret));
    std::string pem[3];
    const char* keys[3] = {"ca.crt", "tls.crt", "tls.key"};
    for (int i = 0; i < 3; ++i) {
      TRELLIS_ASSIGN_OR_RETURN(pem[i], Base64(tls_secret, keys[i], Str(certs, {"data", keys[i]})));
      if (pem[i].empty()) return NotFoundError("secret " + tls_secret + " holds no " + keys[i]);
    }
    const std::string server_name = Str(job, {"spec", "tls", "serverName"});
    auto tls = LoadTlsPem(pem[0], pem[1], pem[2], server_name.empty() ? "trellis" : server_name);
    if (!tls.ok()) return tls.status().Annotate("secret " + tls_secret);
    o.tls = *tls;
  }
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<SchedulerClient> c, SchedulerClient::Connect(o));
  return std::shared_ptr<SchedulerClient>(std::move(c));
}

void SchedulerClients::Forget(const std::string& ns, const std::string& name) {
  MutexLock lock(&mu_);
  kept_.erase({ns, name});
}

void SchedulerClients::KeepOnly(const std::set<std::pair<std::string, std::string>>& keep) {
  MutexLock lock(&mu_);
  for (auto it = kept_.begin(); it != kept_.end();) it = keep.count(it->first) ? std::next(it) : kept_.erase(it);
}

StatusOr<v1::JobProgress> SchedulerClients::StopJob(const Json& job, const std::string& reason) {
  TRELLIS_ASSIGN_OR_RETURN(std::shared_ptr<SchedulerClient> c, For(job));
  // Asked again every half second while the pods are held: a failure keeps the client (its
  // channel reconnects; For() makes a new one for a new job or address), so no Secret is read
  // again for it.
  Status s = c->StopJob(reason);
  return s.ok() ? c->GetProgress() : StatusOr<v1::JobProgress>(s);
}

StatusOr<v1::JobProgress> SchedulerClients::Progress(const Json& job) {
  TRELLIS_ASSIGN_OR_RETURN(std::shared_ptr<SchedulerClient> c, For(job));
  return c->GetProgress();
}

StatusOr<v1::ResizeResponse> SchedulerClients::Resize(const Json& job, int workers, const std::string& reason,
                                                     int servers) {
  TRELLIS_ASSIGN_OR_RETURN(std::shared_ptr<SchedulerClient> c, For(job));
  return c->Resize(workers, reason, servers);
}

}  // namespace trellis::op
