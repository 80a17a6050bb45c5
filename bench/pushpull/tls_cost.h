// bench_pushpull --tls: the same Trellis runs without and with mutual TLS, side by side, and
// what this machine's kernel does with the records (kTLS offload or OpenSSL in user space).
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "bench/pushpull/trellis_pushpull.h"
#include "common/status.h"
#include "common/tls.h"

namespace trellis::bench {

// A throwaway job CA and certificate in `dir` (made if missing).
StatusOr<TlsFiles> BenchTlsFiles(const std::string& dir);

// One TLS handshake over a loopback TCP pair with `files`: where the record layer runs on this
// machine ("kTLS send+recv", "user space", ...), as the data link would get it.
StatusOr<std::string> ProbeTlsOffload(const TlsFiles& files);

// The cost table: per size, for each run name (e.g. "tcp 2w x 2s") the plain and the TLS goodput
// per worker and their ratio. `results` is keyed by run name; TLS runs are "<name> tls".
void PrintTlsCost(const std::vector<uint64_t>& sizes, const std::vector<std::string>& plain_runs,
                  const std::map<std::string, std::map<uint64_t, TrellisSizeResult>>& results,
                  const std::string& offload, std::ostream& out);

}  // namespace trellis::bench
