// The server's side of the gRPC link: one worker's DataService.Stream (raw byte buffers carrying
// the frames of datapath/frame.h), beside the TCP one (datapath/tcp/server_link.h). The service
// keeps the method (pserver/data_service.h); this is the stream's reactor.
//
// Threads: gRPC's callback threads. Each read is one request frame: its header is decoded and the
// frame handed to the receiver (its bytes stay in gRPC's slices, no copy). Bytes that do not parse
// get an error answer under the id they carry (0 when unreadable) and the stream goes on: gRPC's
// framing keeps the next message intact. Answers (Send, any thread) go out one write at a time,
// highest priority first, referencing their payload (no copy).
//
// Bounds: what the receiver holds and has not let go of (`read_ahead`), and the answer bytes not
// sent yet (its byte limit); past either no next read starts, so gRPC's flow control holds the
// worker's requests back instead of memory growing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include "common/base/status.h"
#include "datapath/link.h"

namespace trellis::link {

// What a data stream's metadata says about its worker.
struct StreamHello {
  std::string peer;       // for log lines
  std::string token;      // common/tls/auth.h's token key, "" when absent
  std::string rank_text;  // wire::kRankMetadataKey as sent, "" when absent
  int32_t rank = -1;      // rank_text as a number; -1 when it is not one
};

// Admits a stream: the receiver of its requests, which answers through `sink` (hold it weakly: a
// pull answered after the worker left must not keep the stream), or the status that refuses it
// (the worker's link ends with it).
using AdmitStream = std::function<StatusOr<std::shared_ptr<RequestReceiver>>(
    const StreamHello& hello, std::shared_ptr<AnswerSink> sink)>;

struct GrpcServerLinkOptions {
  ReadAheadLimit read_ahead;
};

// The reactor of one DataService.Stream call (what a callback service's raw Stream method
// returns); it deletes itself when the call is done. `admit` runs once, before the first read.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* AcceptGrpcStream(
    grpc::CallbackServerContext* ctx, const AdmitStream& admit,
    const GrpcServerLinkOptions& options);

}  // namespace trellis::link
