#include "common/tls/tls.h"

#include "common/base/file_util.h"
#include "common/tls/tls_stream.h"

namespace trellis {

TlsFiles TlsFilesOf(const TlsSpec& spec) {
  TlsFiles f;
  f.ca_file = spec.caFile;
  f.cert_file = spec.certFile;
  f.key_file = spec.keyFile;
  f.server_name = spec.serverName;
  return f;
}

StatusOr<TlsFiles> TlsFilesFromEnv(const EnvSource& env) {
  TlsFiles f;
  f.ca_file = env.GetOr(kEnvTlsCaFile, "");
  f.cert_file = env.GetOr(kEnvTlsCertFile, "");
  f.key_file = env.GetOr(kEnvTlsKeyFile, "");
  f.server_name = env.GetOr(kEnvTlsServerName, "trellis");
  const int set = !f.ca_file.empty() + !f.cert_file.empty() + !f.key_file.empty();
  if (set == 0 || set == 3) return f;
  std::string missing;
  for (auto [name, value] : {std::pair{kEnvTlsCaFile, &f.ca_file},
                             std::pair{kEnvTlsCertFile, &f.cert_file},
                             std::pair{kEnvTlsKeyFile, &f.key_file}}) {
    if (value->empty()) missing += std::string(missing.empty() ? "" : ", ") + name;
  }
  return InvalidArgumentError("TLS is half configured: " + missing + " not set (set all of " + kEnvTlsCaFile +
                              ", " + kEnvTlsCertFile + ", " + kEnvTlsKeyFile + ", or none)");
}

void AddTlsEnv(const TlsFiles& files, std::map<std::string, std::string>* env) {
  if (!files.enabled()) return;
  (*env)[kEnvTlsCaFile] = files.ca_file;
  (*env)[kEnvTlsCertFile] = files.cert_file;
  (*env)[kEnvTlsKeyFile] = files.key_file;
  (*env)[kEnvTlsServerName] = files.server_name;
}

StatusOr<TlsPtr> LoadTls(const TlsFiles& files) {
  if (!files.enabled()) return TlsPtr();
  auto c = std::make_shared<TlsCredentials>();
  constexpr int64_t kMaxPemBytes = 1 << 20;
  auto read = [&](const std::string& path, const char* what, std::string* out) -> Status {
    auto text = ReadFileLimited(path, kMaxPemBytes);
    if (!text.ok()) return text.status().Annotate(std::string("TLS ") + what);
    *out = std::move(*text);
    return Status::Ok();
  };
  TRELLIS_RETURN_IF_ERROR(read(files.ca_file, "CA file", &c->ca_pem));
  TRELLIS_RETURN_IF_ERROR(read(files.cert_file, "certificate file", &c->cert_pem));
  TRELLIS_RETURN_IF_ERROR(read(files.key_file, "key file", &c->key_pem));
  return LoadTlsPem(std::move(c->ca_pem), std::move(c->cert_pem), std::move(c->key_pem),
                    files.server_name);
}

StatusOr<TlsPtr> LoadTlsPem(std::string ca_pem, std::string cert_pem, std::string key_pem,
                            std::string server_name) {
  auto c = std::make_shared<TlsCredentials>();
  c->ca_pem = std::move(ca_pem);
  c->cert_pem = std::move(cert_pem);
  c->key_pem = std::move(key_pem);
  c->server_name = std::move(server_name);
  TRELLIS_ASSIGN_OR_RETURN(auto server, TlsContext::Create(*c, TlsContext::Side::kServer));
  TRELLIS_ASSIGN_OR_RETURN(auto client, TlsContext::Create(*c, TlsContext::Side::kClient));
  c->server_ctx = std::move(server);
  c->client_ctx = std::move(client);
  return TlsPtr(std::move(c));
}

StatusOr<TlsPtr> LoadTlsFromEnv(const EnvSource& env) {
  TRELLIS_ASSIGN_OR_RETURN(TlsFiles files, TlsFilesFromEnv(env));
  return LoadTls(files);
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsPtr& tls) {
  if (!tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls->ca_pem;
  o.pem_key_cert_pairs.push_back({tls->key_pem, tls->cert_pem});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsPtr& tls,
                                                            grpc::ChannelArguments* args) {
  if (!tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls->ca_pem;
  o.pem_private_key = tls->key_pem;
  o.pem_cert_chain = tls->cert_pem;
  // Peers are addressed by IP or pod DNS; the certificate names the job's service instead.
  args->SetSslTargetNameOverride(tls->server_name);
  return grpc::SslCredentials(o);
}

}  // namespace trellis
