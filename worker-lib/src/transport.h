// The worker's side of the data path, behind one small interface so that another bulk
// transport (raw TCP framed and authenticated with the job token, shared memory) can be added
// without touching the scheduling code. The gRPC implementation is grpc_transport.cc.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "pserver/wire.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis {

struct SliceRequest {
  wire::Op op = wire::Op::kPush;
  uint64_t key = 0;
  uint32_t slice = 0;
  int64_t step = 0;
  int32_t priority = 0;
  // Sent without a copy: must stay valid until the reply ran.
  const float* payload = nullptr;
  int64_t payload_elements = 0;
};

// The bytes of an answer; valid only during the reply call.
struct Payload {
  const wire::Chunks* chunks = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

// Runs exactly once per request, on a transport thread: OK with the answer's payload (empty
// for push and init), or the error (the server's, or the connection's).
using SliceReply = std::function<void(const Status&, const Payload&)>;

class ServerConnection {
 public:
  // Closing fails the requests still pending with CANCELLED.
  virtual ~ServerConnection() = default;
  virtual const std::string& address() const = 0;
  // Hands the slice's shard map to the server (control call, bounded by `timeout_ms`).
  virtual Status InstallShardMap(const v1::ShardMap& map, int32_t server_rank,
                                 int64_t timeout_ms) = 0;
  // Queues one request; never blocks on the network.
  virtual void Send(const SliceRequest& request, SliceReply reply) = 0;
};

struct ConnectionOptions {
  std::string address;  // host:port
  std::string token;
  int32_t worker_rank = 0;
  int64_t slice_bytes = 4 << 20;
};

// A gRPC connection: one channel and one long-lived raw bidirectional stream.
StatusOr<std::unique_ptr<ServerConnection>> ConnectGrpc(const ConnectionOptions& options);

}  // namespace trellis
