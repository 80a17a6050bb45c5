// TLS between the parts of a job (docs/operations.md#tls): the certificate files a process is
// given (spec.tls -> TRELLIS_TLS_* -> here), loaded once into a TlsCredentials that both the gRPC
// credentials (scheduler, data service) and the raw-TCP data link (common/tls/tls_stream.h) use.
// Every side requires and verifies its peer's certificate against the job CA (mutual TLS);
// clients also check the server's certificate carries `server_name`.
#pragma once

#include <map>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "common/config/env.h"
#include "common/config/env_names.h"
#include "common/job/job_spec.h"
#include "common/base/status.h"

namespace trellis {

// The environment contract: kEnvTls* in common/config/env_names.h (operator and launcher set it
// on every process; an agent's child inherits it). All three files or none.

struct TlsFiles {
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string server_name = "trellis";
  bool enabled() const { return !ca_file.empty(); }
};

TlsFiles TlsFilesOf(const TlsSpec& spec);
// TRELLIS_TLS_*: none set -> TLS off; a partial set is an error naming what is missing.
StatusOr<TlsFiles> TlsFilesFromEnv(const EnvSource& env);
// Adds TRELLIS_TLS_* for `files` (nothing when TLS is off).
void AddTlsEnv(const TlsFiles& files, std::map<std::string, std::string>* env);

class TlsContext;  // common/tls/tls_stream.h

// The loaded PEM text and the OpenSSL contexts built from it. Immutable; shared.
struct TlsCredentials {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::string server_name;
  std::shared_ptr<const TlsContext> server_ctx;  // accepts: requires a client certificate
  std::shared_ptr<const TlsContext> client_ctx;  // connects: checks server_name
};
using TlsPtr = std::shared_ptr<const TlsCredentials>;  // nullptr: TLS off

// Reads and checks the files (certificate matches key, CA parses). Off: nullptr.
StatusOr<TlsPtr> LoadTls(const TlsFiles& files);
// The same from PEM text at hand (e.g. a Secret's keys read by the operator).
StatusOr<TlsPtr> LoadTlsPem(std::string ca_pem, std::string cert_pem, std::string key_pem,
                            std::string server_name);
// TlsFilesFromEnv + LoadTls.
StatusOr<TlsPtr> LoadTlsFromEnv(const EnvSource& env);

// gRPC credentials: insecure when `tls` is null, else mutual TLS (the server requires and
// verifies a client certificate; the client verifies the server against the CA and
// server_name, which it sets as the target name override in `args`).
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const TlsPtr& tls);
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const TlsPtr& tls,
                                                            grpc::ChannelArguments* args);

}  // namespace trellis
