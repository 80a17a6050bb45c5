// Data-path frames (datapath/frame.h) carried on gRPC: DataService.Stream moves raw byte buffers,
// not protobuf. With the rest of datapath/grpc/, the only datapath code that knows gRPC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include "datapath/frame.h"

namespace trellis::wire {

inline constexpr char kRankMetadataKey[] = "x-trellis-rank";
inline constexpr char kStreamMethod[] = "/trellis.v1.DataService/Stream";

// Big HTTP/2 windows keep a multi-MiB slice from stalling on flow control.
inline constexpr int kStreamWindowBytes = 32 << 20;
// Channel/server arguments of the data path (both ends): big flow-control windows and big socket
// reads, so a multi-MiB slice moves in few syscalls. (HTTP/2 frames bigger than the default
// 16 KiB measured slower here.) The receive limit is MaxMessageBytes (frame.h).
// `set(name, value)` is ChannelArguments::SetInt or ServerBuilder::AddChannelArgument.
template <typename SetInt>
void ApplyDataChannelArgs(SetInt set) {
  set("grpc.http2.lookahead_bytes", kStreamWindowBytes);
  set("grpc.http2.bdp_probe", 1);
  set("grpc.experimental.tcp_read_chunk_size", 1 << 20);
  set("grpc.experimental.tcp_min_read_chunk_size", 256 << 10);
  set("grpc.experimental.tcp_max_read_chunk_size", 8 << 20);
}

// The data of each slice, in order (a view: valid while the slices live).
Chunks ChunksOf(const std::vector<grpc::Slice>& slices);

// Builds a frame from a header and a payload that is referenced, not copied: `release(arg)` is
// called when gRPC no longer needs the bytes (possibly after the frame was sent).
grpc::ByteBuffer MakeFrame(const uint8_t* header, size_t header_bytes, const std::string& message,
                           const void* payload, size_t payload_bytes, void (*release)(void*),
                           void* release_arg);

}  // namespace trellis::wire
