// Baseline (a): raw loopback TCP echo. The physical ceiling the data path is compared with.
//
// One message of M bytes = a writer thread sends M bytes while the calling thread reads the M
// echoed bytes; the server echoes as it reads. The next message starts when the whole echo has
// arrived (like PushPull(...).Wait() per step). Throughput = M * messages / seconds, i.e. the
// message size counted once per direction; each direction carries that rate at the same time.
#pragma once

#include <cstdint>

#include "bench/common/stats.h"
#include "common/base/status.h"

namespace trellis::bench {

struct TcpEchoResult {
  double gbytes_per_s = 0;  // 1e9 bytes / s, one direction
  double p50_s = 0;         // per-message round trip
  double p99_s = 0;
  int messages = 0;
  int socket_buffer_bytes = 0;  // SO_SNDBUF the kernel granted (after its doubling)
  double cpu_s_per_message = 0;  // CPU of all three threads (writer, echo, reader) per message
};

StatusOr<TcpEchoResult> MeasureTcpEcho(uint64_t message_bytes, const Budget& budget);

}  // namespace trellis::bench
