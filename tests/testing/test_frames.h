// Helpers for pserver tests: request frames as byte vectors, and chunked views that split the
// bytes at awkward places (floats straddling chunk boundaries).
#pragma once

#include <cstring>
#include <vector>

#include "datapath/frame.h"

namespace trellis::testing {

inline std::vector<uint8_t> RequestBytes(wire::Op op, uint64_t key, uint32_t slice, int64_t step,
                                         const std::vector<float>& payload, uint64_t id = 1,
                                         int32_t priority = 0) {
  wire::RequestHeader h;
  h.op = op;
  h.request_id = id;
  h.key = key;
  h.slice = slice;
  h.step = step;
  h.priority = priority;
  h.payload_bytes = payload.size() * sizeof(float);
  std::vector<uint8_t> out(wire::kRequestHeaderBytes + h.payload_bytes);
  wire::EncodeRequestHeader(h, out.data());
  if (!payload.empty()) std::memcpy(out.data() + wire::kRequestHeaderBytes, payload.data(), h.payload_bytes);
  return out;
}

// A bulk frame (op kBulk, request id `id`) whose body is `entries`, each a whole request frame
// (RequestBytes).
inline std::vector<uint8_t> BulkBytes(const std::vector<std::vector<uint8_t>>& entries,
                                      uint64_t id = 1, int32_t priority = 0) {
  std::vector<uint8_t> body;
  for (const auto& e : entries) body.insert(body.end(), e.begin(), e.end());
  wire::RequestHeader h;
  h.op = wire::Op::kBulk;
  h.request_id = id;
  h.priority = priority;
  h.payload_bytes = body.size();
  std::vector<uint8_t> out(wire::kRequestHeaderBytes);
  wire::EncodeRequestHeader(h, out.data());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// An OK answer frame to request `id` carrying `payload`; `claimed_bytes` (when given) is the
// payload length its header announces instead of the real one (a lie, for hostile-peer tests).
inline std::vector<uint8_t> ResponseBytes(uint64_t id, const std::vector<float>& payload,
                                          uint64_t claimed_bytes = ~0ull) {
  wire::ResponseHeader h;
  h.request_id = id;
  h.payload_bytes = claimed_bytes != ~0ull ? claimed_bytes : payload.size() * sizeof(float);
  std::vector<uint8_t> out(wire::kResponseHeaderBytes);
  wire::EncodeResponseHeader(h, out.data());
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  out.insert(out.end(), p, p + payload.size() * sizeof(float));
  return out;
}

// A replay (wire::Op::kReplay) of the push request `push` (RequestBytes of kPush or a 2-bit
// push); with `push` empty, the end of a worker's replays announcing `count` replays.
inline std::vector<uint8_t> ReplayBytes(const std::vector<uint8_t>& push, uint64_t key,
                                        uint32_t slice, int64_t step_or_count) {
  wire::RequestHeader h;
  h.op = wire::Op::kReplay;
  h.request_id = 1;
  h.key = key;
  h.slice = slice;
  h.step = step_or_count;
  h.payload_bytes = push.size();
  std::vector<uint8_t> out(wire::kRequestHeaderBytes);
  wire::EncodeRequestHeader(h, out.data());
  out.insert(out.end(), push.begin(), push.end());
  return out;
}

// Splits `bytes` into chunks of `chunk` bytes (the last shorter).
inline wire::Chunks Split(const std::vector<uint8_t>& bytes, size_t chunk) {
  wire::Chunks c;
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    c.emplace_back(bytes.data() + off, std::min(chunk, bytes.size() - off));
  }
  return c;
}

}  // namespace trellis::testing
