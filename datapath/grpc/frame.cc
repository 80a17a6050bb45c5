#include "datapath/grpc/frame.h"

namespace trellis::wire {

Chunks ChunksOf(const std::vector<grpc::Slice>& slices) {
  Chunks out;
  out.reserve(slices.size());
  for (const auto& s : slices) out.emplace_back(s.begin(), s.size());
  return out;
}

grpc::ByteBuffer MakeFrame(const uint8_t* header, size_t header_bytes, const std::string& message,
                           const void* payload, size_t payload_bytes, void (*release)(void*),
                           void* release_arg) {
  std::vector<grpc::Slice> slices;
  slices.reserve(2);
  if (message.empty()) {
    slices.emplace_back(header, header_bytes);  // copies the small header
  } else {
    std::string head(reinterpret_cast<const char*>(header), header_bytes);
    head += message;
    slices.emplace_back(head.data(), head.size());
  }
  if (payload_bytes > 0) {
    // gRPC's slice API takes a non-const pointer; the bytes are only read.
    slices.emplace_back(const_cast<void*>(payload), payload_bytes, release, release_arg);
  } else if (release != nullptr) {
    release(release_arg);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace trellis::wire
