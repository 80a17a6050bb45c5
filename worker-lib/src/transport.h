// What the worker's data path carries: a slice request, its reply and the options of a server
// connection (server_connection.h: one per parameter server, over a link that moves the frames,
// datapath/link.h, of the job's spec.transport). The worker knows no transport and no address
// format: the server's DataAddress is parsed once (datapath/address.h) and handed down.
#pragma once

#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tls/tls.h"
#include "datapath/address.h"
#include "datapath/frame.h"
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
  // A compressed push (wire::IsTwoBit(op)): the 2-bit frame sent instead of `payload`. Shared
  // ownership defines its lifetime: the transport holds a reference until the bytes left the
  // process (gRPC: the slice's release; TCP: the end of the write), the worker until the reply
  // ran, so the frame outlives both whatever finishes first (a reply, a deadline, a close).
  std::shared_ptr<const std::vector<uint8_t>> encoded;
  // Where the answer's payload goes (pull, pushpull). A bulk transport reads it straight in,
  // holding `out_mu` shared while it writes and writing nothing once `out_closed` is true (the
  // operation completed; the user may have freed `out`). Both outlive the reply. Optional: a
  // transport may instead hand the bytes to the reply (Payload::chunks).
  float* out = nullptr;
  int64_t out_elements = 0;
  std::shared_mutex* out_mu = nullptr;
  const std::atomic<bool>* out_closed = nullptr;
};

// What a transport sends after the request header: the 2-bit frame of a compressed push,
// else the float32 values.
inline const void* PayloadData(const SliceRequest& r) {
  return r.encoded ? static_cast<const void*>(r.encoded->data()) : r.payload;
}
inline uint64_t PayloadBytes(const SliceRequest& r) {
  return r.encoded ? r.encoded->size() : static_cast<uint64_t>(r.payload_elements) * sizeof(float);
}
// payload_bytes is PayloadBytes(r); request_id left 0.
wire::RequestHeader HeaderOf(const SliceRequest& r);

// The bytes of an answer; valid only during the reply call.
struct Payload {
  const wire::Chunks* chunks = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
  bool in_place = false;  // the bytes were already read into SliceRequest::out (chunks unused)
  // A packed answer (datapath/codec/packed_sum.h; wire::ResponseHeader::packed), never read
  // in place: the worker validates and decodes it into `out`.
  bool packed = false;
};

// Runs exactly once per request, on a transport thread: OK with the answer's payload (empty
// for push and init), or the error (the server's, or the connection's).
using SliceReply = std::function<void(const Status&, const Payload&)>;
// Runs at most once, when the request's bytes were handed to the kernel: on a transport thread,
// or inside Send when the caller's thread sent them itself; never under a transport lock. It may
// not run at all when the connection breaks first (the reply then reports the error). The worker frees the slice's in-flight place here, so the
// water mark counts what is on its way to the server, not answers that wait for other workers.
using SliceSent = std::function<void()>;

struct ConnectionOptions {
  DataAddress address;  // the server's (its service, "host:port", names it in messages)
  bool use_local_socket = true;  // TRELLIS_LOCAL_SOCKET: try its local socket before TCP
  std::string token;
  int32_t worker_rank = 0;
  int64_t slice_bytes = 4 << 20;
  int64_t timeout_ms = 120000;  // bounds connecting and the handshake
  TlsPtr tls;  // mutual TLS on the link (both transports) and its control calls; nullptr: off
};

}  // namespace trellis
