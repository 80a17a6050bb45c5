// Baselines (b) and (c): a bare gRPC echo service on loopback and the two measurements made
// against it (unary round-trip latency; bidi-stream echo throughput of protobuf bytes).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "bench/common/stats.h"
#include "common/base/status.h"

namespace trellis::bench {

// The echo server, callback API, listening on 127.0.0.1:<free port>.
class GrpcEchoServer {
 public:
  static StatusOr<std::unique_ptr<GrpcEchoServer>> Start();
  ~GrpcEchoServer();
  const std::string& address() const { return address_; }

  struct Impl;

 private:
  explicit GrpcEchoServer(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

struct LatencyResult {
  double p50_s = 0;
  double p99_s = 0;
  int calls = 0;
};

struct StreamResult {
  double gbytes_per_s = 0;  // message bytes / s, one direction (same convention as the TCP echo)
  int messages = 0;
};

// Unary round trips of `bytes` each (fresh deadline per call) on one channel.
StatusOr<LatencyResult> MeasureGrpcUnary(const std::string& address, uint64_t bytes,
                                         const Budget& budget);
// One bidi stream: write a message, read its echo, repeat.
StatusOr<StreamResult> MeasureGrpcStream(const std::string& address, uint64_t message_bytes,
                                         const Budget& budget);

}  // namespace trellis::bench
