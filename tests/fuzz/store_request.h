// What the store harnesses share: a shard map of key 7 alone, one slice; and one request, a frame
// for key 7 from worker 0, split into chunks of `chunk` bytes (0: one chunk), handed to
// SliceStore::Handle as a front-end would, and what it answered (how many times, the status, the
// values or the packed answer).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "datapath/frame.h"
#include "pserver/slice_store.h"

namespace trellis_fuzz {

// Key 7 of `n` elements as one slice on `server` of `num_servers`, of map world epoch `epoch`.
inline trellis::v1::ShardMap OneSliceMap(int64_t n, int32_t num_servers = 1, int32_t server = 0,
                                         int64_t epoch = 0) {
  trellis::v1::ShardMap map;
  map.set_num_servers(num_servers);
  map.set_slice_bytes(1 << 20);
  map.set_world_epoch(epoch);
  auto* ks = map.add_keys();
  ks->mutable_key()->set_id(7);
  ks->mutable_key()->set_num_elements(n);
  auto* s = ks->add_slices();
  s->set_index(0);
  s->set_offset(0);
  s->set_num_elements(n);
  s->set_server(server);
  return map;
}

struct Outcome {
  int calls = 0;
  trellis::Status status;
  std::vector<float> values;
  std::vector<uint8_t> packed;
};

inline Outcome Run(trellis::SliceStore& store, trellis::wire::Op op, int64_t step,
                   const std::vector<uint8_t>& payload, size_t chunk) {
  namespace wire = trellis::wire;
  wire::RequestHeader h;
  h.op = op;
  h.key = 7;
  h.step = step;
  h.payload_bytes = payload.size();
  std::vector<uint8_t> bytes(wire::kRequestHeaderBytes + payload.size());
  wire::EncodeRequestHeader(h, bytes.data());
  if (!payload.empty()) {
    std::memcpy(bytes.data() + wire::kRequestHeaderBytes, payload.data(), payload.size());
  }
  wire::Chunks chunks;
  if (chunk == 0) chunk = bytes.size();
  for (size_t off = 0; off < bytes.size(); off += chunk) {
    chunks.emplace_back(bytes.data() + off, std::min(chunk, bytes.size() - off));
  }
  Outcome out;
  store.Handle(0, h, chunks, [&out](const trellis::Status& st, trellis::Answer a) {
    ++out.calls;
    out.status = st;
    if (a.values) out.values = *a.values;
    if (a.packed) out.packed = *a.packed;
  });
  return out;
}

}  // namespace trellis_fuzz
