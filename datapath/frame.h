// The binary frame layout of the data path (see proto/trellis/v1/data.proto), shared by the
// parameter server and the worker library over both transports. A frame is a small header and a
// payload that may arrive split into chunks at arbitrary byte boundaries (gRPC slices, TCP read
// buffers); the helpers here read headers and floats across those boundaries without gathering
// the payload. No transport here: datapath/grpc/frame.h adapts frames to gRPC byte buffers,
// datapath/tcp/wire.h frames them on a socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/base/status.h"

namespace trellis::wire {

inline constexpr uint32_t kRequestMagic = 0x31515254;   // "TRQ1" little-endian
inline constexpr uint32_t kResponseMagic = 0x31505254;  // "TRP1"
inline constexpr size_t kRequestHeaderBytes = 48;
inline constexpr size_t kResponseHeaderBytes = 40;

// The largest frame either end accepts: one slice plus headers (at least 4 MiB).
inline int64_t MaxMessageBytes(int64_t slice_bytes) {
  return (slice_bytes > (4 << 20) ? slice_bytes : (4 << 20)) + (64 << 10);
}

// kBulk: several small requests in one frame (see ParseBulk); answered one by one.
// kPushTwoBit / kPushPullTwoBit are kPush / kPushPull whose payload is one 2-bit frame
// (datapath/codec/twobit.h) of the slice's elements instead of float32 values; the answer of
// kPushPullTwoBit is full precision. New op codes keep the uncompressed frames byte-identical.
// The same ops carry a 16-bit frame (datapath/codec/half.h) instead; the magic tells which.
// kPullPacked / kPushPullTwoBitPacked are kPull / kPushPullTwoBit whose answer may be packed
// (datapath/codec/packed_sum.h): the server packs it when every push of the step was a 2-bit
// frame of one threshold (aggregate mode), else answers float32; ResponseHeader::packed says
// which. The old ops' frames are unchanged.
// kSave / kLoad are server-wide (key and slice name no slice): rank 0's checkpoint round
// (docs/checkpoints.md). kSave's key is a key left out of the file (the checkpointer's own).
enum class Op : uint8_t {
  kPush = 1,
  kPull = 2,
  kPushPull = 3,
  kInit = 4,
  kBulk = 5,
  kPushTwoBit = 6,
  kPushPullTwoBit = 7,
  kPullPacked = 8,
  kPushPullTwoBitPacked = 9,
  kSave = 16,
  kLoad = 17,
  // Crash recovery, ops 18..21. A worker rejoining a running job (docs/checkpoints.md):
  // kRejoin is server-wide: the connection's worker restarted and starts over at the donor's
  // step (SliceStore treats its pushes of steps already counted as no-ops). kStash puts a
  // slice's values in the slice's side buffer under the rejoin id (the header's step field);
  // kFetch answers them once and drops them. Neither touches the step protocol.
  kRejoin = 18,
  kStash = 19,
  kFetch = 20,
  kReplay = 21,  // a server rebuilt from the workers' pushes; see IsReplay below
  // Elastic jobs: server-wide, the world of workers (its epoch in the header's step field) on
  // every slice from its next step (every member sends it, and waits for the answer, before its
  // first push in that world; pserver/world_schedule.h). The payload is the members' ranks
  // (slots), little-endian int32 (EncodeWorldMembers).
  kWorld = 22,
  // Server resize, slice-level (datapath/handover.h; pserver/slice_handover.h): once the resize's
  // shard map is installed, a worker asks a moved slice's old owner for its state (kHandOut, the
  // step the slice completed in the header's step field, the part wanted in the payload) and
  // gives it to the new owner (kHandIn, the part and its data in the payload).
  kHandOut = 23,
  kHandIn = 24,
};
inline bool IsHandoverOp(Op op) { return op == Op::kHandOut || op == Op::kHandIn; }
inline bool IsRejoinOp(uint8_t op) { return op >= 18 && op <= 20; }
inline constexpr uint8_t kMaxDataOp = 9;  // ops 1..9 are data ops; 16 and 17 the checkpoint round
inline bool IsKnownOp(uint8_t op) {
  return (op >= 1 && op <= kMaxDataOp) || op == static_cast<uint8_t>(Op::kSave) ||
         op == static_cast<uint8_t>(Op::kLoad) || IsRejoinOp(op) ||
         op == static_cast<uint8_t>(Op::kReplay) || op == static_cast<uint8_t>(Op::kWorld) ||
         IsHandoverOp(static_cast<Op>(op));
}
// kReplay: after reconnecting to a restarted server, a worker re-sends the pushes it retained.
// Key, slice and step name the push; the payload is the whole push request as it was sent (a
// request header with op kPush or kPushTwoBit, then its payload). A kReplay with no payload ends
// the worker's replays on that server; its step is how many replays it sent before.
inline bool IsReplay(Op op) { return op == Op::kReplay; }
// "push", "pull", "pushpull", "init", "bulk", "push2bit", "pushpull2bit", "pullpacked",
// "pushpull2bitpacked", "save", "load", "rejoin", "stash", "fetch", "replay", "world", "handout",
// "handin", "op(N)"
const char* OpName(Op op);
// The payload is a 2-bit frame (any byte length; the frame's own checks apply).
inline bool IsTwoBit(Op op) {
  return op == Op::kPushTwoBit || op == Op::kPushPullTwoBit || op == Op::kPushPullTwoBitPacked;
}
// The answer may be a packed answer instead of float32 values.
inline bool AcceptsPacked(Op op) {
  return op == Op::kPullPacked || op == Op::kPushPullTwoBitPacked;
}
// Whether requests of `op` carry a payload (floats, a 2-bit frame, or a bulk's sub-requests).
inline bool OpHasPayload(Op op) {
  return op == Op::kPush || op == Op::kPushPull || op == Op::kInit || op == Op::kBulk ||
         op == Op::kStash || IsTwoBit(op) || IsReplay(op) || op == Op::kWorld ||
         IsHandoverOp(op);
}
// The payload is float32 values (a whole number of them); a bulk's and a 2-bit frame's lengths
// are checked by their own parsers.
inline bool PayloadIsFloat32(Op op) {
  return op == Op::kPush || op == Op::kPushPull || op == Op::kInit || op == Op::kStash;
}
// The answer carries the step's values.
inline bool AnswersWithValues(Op op) {
  return op == Op::kPull || op == Op::kPushPull || op == Op::kPushPullTwoBit ||
         AcceptsPacked(op) || op == Op::kFetch || op == Op::kHandOut;
}

struct RequestHeader {
  Op op = Op::kPush;
  uint64_t request_id = 0;
  uint64_t key = 0;
  int64_t step = 0;
  uint32_t slice = 0;
  int32_t priority = 0;
  uint64_t payload_bytes = 0;
};

struct ResponseHeader {
  Op op = Op::kPush;
  uint64_t request_id = 0;
  int32_t code = 0;  // grpc::StatusCode
  uint32_t message_bytes = 0;
  uint64_t payload_bytes = 0;
  // Byte 5 (0 in every other answer): the payload is a packed answer, not float32 values.
  bool packed = false;
};

// Non-owning view of a frame's bytes: its chunks in order (gRPC slices, read buffers). Valid
// while the memory it was made from lives.
using Chunks = std::vector<std::span<const uint8_t>>;
size_t TotalBytes(const Chunks& chunks);

// Copies `n` bytes starting at byte `offset` of the chunked data into `dst`.
// REQUIRES: offset + n <= TotalBytes(chunks).
void CopyOut(const Chunks& chunks, size_t offset, size_t n, void* dst);
// The `n` bytes at `offset` as one contiguous run: a pointer into the chunk that holds them
// all, else a copy in *scratch. REQUIRES: offset + n <= TotalBytes(chunks).
const uint8_t* Contiguous(const Chunks& chunks, size_t offset, size_t n,
                          std::vector<uint8_t>* scratch);
// Like CopyOut, for a float payload: dst[i] = value i (bytes may straddle chunks).
void CopyFloats(const Chunks& chunks, size_t offset, size_t count, float* dst);
// dst[i] += value i.
void AddFloats(const Chunks& chunks, size_t offset, size_t count, float* dst);

// kWorld's payload: the members' slots as little-endian int32.
std::vector<uint8_t> EncodeWorldMembers(const std::vector<int32_t>& members);
// The members in a kWorld's payload (`bytes` from byte `offset` of `frame`): INVALID_ARGUMENT when
// it is not a whole number of int32 or names more than `slots` of them.
StatusOr<std::vector<int32_t>> ParseWorldMembers(const Chunks& frame, size_t offset,
                                                 uint64_t bytes, int32_t slots);

void EncodeRequestHeader(const RequestHeader& h, uint8_t out[kRequestHeaderBytes]);
void EncodeResponseHeader(const ResponseHeader& h, uint8_t out[kResponseHeaderBytes]);
// The longest error text a response carries; longer ones are cut.
inline constexpr uint32_t kMaxErrorBytes = 64 << 10;
// An error answer (or a TCP hello's verdict, request id 0): response header + message, no payload.
std::vector<uint8_t> EncodeStatusFrame(Op op, uint64_t request_id, const Status& st);

// The fixed header fields alone (both transports): a request's magic and op are checked; a
// response's magic. REQUIRES: h holds kRequestHeaderBytes / kResponseHeaderBytes.
Status ParseRequestHeader(const uint8_t* h, RequestHeader* out);
Status ParseResponseHeader(const uint8_t* h, ResponseHeader* out);
// Parses and checks a request: magic, op, payload length against the bytes present. Errors are
// INVALID_ARGUMENT naming what is wrong ("malformed frame: 7 bytes, shorter than the 48-byte
// header"). On error `*request_id` is the id if the header was long enough to hold one, else 0.
Status DecodeRequest(const Chunks& frame, RequestHeader* out, uint64_t* request_id);
// Parses a response; `message` receives the error text (if any). The payload starts at
// kResponseHeaderBytes + message_bytes.
Status DecodeResponse(const Chunks& frame, ResponseHeader* out, std::string* message);

// A bulk frame: request header with op kBulk (its own request id, the highest priority of its
// entries) and a payload made of the entries back to back, each a whole request header (its
// own request id, op push, pull, pushpull or one of their 2-bit forms) followed by that entry's
// payload. The server
// answers each entry with an ordinary response frame under the entry's id; an error about the
// bulk itself (it does not parse) is answered under the bulk's id and nothing in it is served.
inline constexpr uint32_t kMaxBulkEntries = 4096;
struct BulkEntry {
  RequestHeader header;
  size_t offset = 0;  // where the entry's header starts in the frame
  size_t bytes = 0;   // header + payload
};
// Parses and checks the entries of the bulk body at [offset, offset + bytes) of `frame`: every
// entry's header as DecodeRequest checks a request, no nested bulk or init, lengths adding up
// exactly, at most kMaxBulkEntries. Errors are INVALID_ARGUMENT "malformed bulk: entry 3: ...".
Status ParseBulk(const Chunks& frame, size_t offset, uint64_t bytes, std::vector<BulkEntry>* out);
// The bytes [offset, offset + n) of `chunks` as chunks (a view; nothing copied).
Chunks SubChunks(const Chunks& chunks, size_t offset, size_t n);

}  // namespace trellis::wire
