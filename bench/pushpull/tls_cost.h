// bench_pushpull --tls: every Trellis column measured again with mutual TLS right after the plain
// one, the cost side by side, and where this machine's kernel puts the TLS record layer (kTLS
// offload or OpenSSL in user space).
#pragma once

#include <ostream>
#include <string>

#include "bench/pushpull/pass.h"
#include "common/base/status.h"
#include "common/tls/tls.h"

namespace trellis::bench {

// A throwaway job CA and certificate in `dir` (created).
StatusOr<TlsFiles> BenchTlsFiles(const std::string& dir);

// One TLS handshake over a loopback TCP pair with `files`: where the record layer of the raw
// data link runs on this machine ("kTLS send+recv", "user space", ...).
StatusOr<std::string> ProbeTlsOffload(const TlsFiles& files);

// Per size, for each plain column of `pass` ("tcp 2w x 2s"): its goodput (sum over workers), the
// goodput of "<column> tls", and TLS / plain.
void PrintTlsCost(const PassResult& pass, std::ostream& out);

}  // namespace trellis::bench
