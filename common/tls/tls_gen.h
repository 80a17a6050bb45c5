// A throwaway job CA and one certificate for every part of a local job (trellis-launch
// --tls, the tests and bench_pushpull --tls). Clusters bring their own (a Secret; e.g. from
// cert-manager): see docs/operations.md#tls.
#pragma once

#include <string>

#include "common/base/status.h"
#include "common/tls/tls.h"

namespace trellis {

// Writes ca.crt, tls.crt and tls.key (mode 0600) into `dir` (which exists): a fresh P-256 CA
// and a certificate it signed for `server_name` (DNS name, server and client auth), valid for
// 30 days. Returns the files as TlsFiles.
StatusOr<TlsFiles> WriteJobCertificates(const std::string& dir,
                                        const std::string& server_name = "trellis");

}  // namespace trellis
