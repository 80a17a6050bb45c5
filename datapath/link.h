// A link moves data-path frames between one worker and one server (DESIGN: the wire contract,
// one frame format over either transport). The interfaces here know no transport: each one
// implements them in its own folder (raw TCP and the local socket: datapath/tcp/; a gRPC stream:
// datapath/grpc/), and the worker opens a link through datapath/connect.h. A link knows how bytes
// travel and nothing of what they mean: the worker's connection above it
// (worker-lib/src/server_connection.cc) numbers requests, routes answers and fails what is pending.
//
// The worker's side:
//  * Write(frame) queues one request frame (a request, or a bulk and its entries) and never blocks
//    on the network. Payloads are sent from the caller's memory without a copy; `sent` runs once
//    their bytes were handed to the kernel (on a link thread, or inside Write).
//  * Each answer reaches the receiver's OnAnswer, in arrival order, on the link's reading thread,
//    with its payload still unread: the receiver picks where it lands (AnswerPayload).
//  * OnClosed runs exactly once, when the link is over (the peer closed, an error, the link
//    destroyed): after the last OnAnswer and after the link let go of every payload it was given.
//    Frames written after that are dropped without touching their payloads (their `sent` does not
//    run); the receiver fails them.
//
// The server's side: a transport reads whole request frames (RequestFrame) and hands them to the
// connection's front door (pserver/front_door.h), which answers through the transport's
// AnswerSink (AnswerFrame), highest priority first.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"
#include "common/tls/tls.h"
#include "datapath/address.h"
#include "datapath/frame.h"

namespace trellis::link {

// One request frame: a request header and its payload, or a bulk's header followed by its entries
// (each a header and a payload). Headers live in the frame; payloads are the caller's memory.
struct Part {
  uint8_t head[wire::kRequestHeaderBytes];
  const void* payload = nullptr;
  uint64_t payload_bytes = 0;
  // A compressed push's 2-bit frame (the payload points into it): held until its bytes left.
  std::shared_ptr<const std::vector<uint8_t>> encoded;
};
struct OutFrame {
  Part first;
  std::vector<Part> entries;  // a bulk's entries, after `first` (whose payload they are)
  std::function<void()> sent;  // may be empty
};

// Lets a reader write into memory that another thread may retire meanwhile (the worker's `out`,
// freed by the user once the operation completed): Begin() before each piece written returns
// false when the memory must not be touched any more; End() after each piece.
class WriteGuard {
 public:
  virtual ~WriteGuard() = default;
  virtual bool Begin() = 0;
  virtual void End() = 0;
};

// The payload of the answer being delivered; valid only during OnAnswer. Use at most one of
// ReadInto and View; what is not read is skipped.
class AnswerPayload {
 public:
  virtual ~AnswerPayload() = default;
  virtual uint64_t bytes() const = 0;
  // The whole payload into `dst`, each piece under `guard` (bytes the guard refuses are
  // dropped). An error ends the link (the receiver reports it for this answer).
  virtual Status ReadInto(void* dst, WriteGuard* guard) = 0;
  // The whole payload as chunks, valid until OnAnswer returns.
  virtual StatusOr<wire::Chunks> View() = 0;
};

class LinkReceiver {
 public:
  virtual ~LinkReceiver() = default;
  virtual void OnAnswer(const wire::ResponseHeader& header, std::string_view message,
                        AnswerPayload& payload) = 0;
  // `status`: CANCELLED when the link was destroyed, else why it ended (UNAVAILABLE, or the
  // server's error about the stream), its message naming the server.
  virtual void OnClosed(const Status& status) = 0;
};

class WorkerLink {
 public:
  // Closes the link: OnClosed(CANCELLED) has run when the destructor returns (unless it ran
  // before), and no link thread runs any more.
  virtual ~WorkerLink() = default;
  // Begins reading answers; call once, after the receiver is ready. The receiver outlives the link.
  virtual void Start(LinkReceiver* receiver) = 0;
  virtual void Write(OutFrame frame) = 0;
};

struct LinkOptions {
  DataAddress address;            // the server's; messages name its service ("host:port")
  bool use_local_socket = true;   // the TCP link tries the server's local socket first
  std::string token;
  int32_t worker_rank = 0;
  uint64_t max_answer_payload = 0;  // answers above it end the link (wire::MaxMessageBytes)
  int64_t timeout_ms = 120000;      // bounds connecting and the handshake
  TlsPtr tls;                       // nullptr: plaintext
};

// The server's side.

// What one connection may have read and not had served yet (queued or being served): past it,
// the server's transport stops reading that connection until some is served.
struct ReadAheadLimit {
  size_t requests = 1024;
  size_t bytes = 0;  // ParameterServer: two maximal messages
};
struct ReadAhead {  // a connection's count; GUARDED_BY its owner's lock
  size_t requests = 0;
  size_t bytes = 0;
  // Whether `more` bytes may be read now. A connection with nothing unserved may always read
  // one more request, so a limit below one message cannot stall it.
  bool Fits(const ReadAheadLimit& limit, size_t more) const {
    return requests == 0 || (requests < limit.requests && bytes + more <= limit.bytes);
  }
};

// One answer frame: the response header (and an error's message) and the payload, which is the
// server's result buffer, held (not copied) until the frame is sent.
struct AnswerFrame {
  int32_t priority = 0;
  std::vector<uint8_t> head;  // response header + message
  std::shared_ptr<const std::vector<float>> values;   // the float32 payload, or
  std::shared_ptr<const std::vector<uint8_t>> packed;  // the packed one, when set

  // An error answer (or a hello's verdict, id 0): jumps every queue.
  static AnswerFrame Error(wire::Op op, uint64_t request_id, const Status& status) {
    AnswerFrame a;
    a.priority = INT32_MAX;
    a.head = wire::EncodeStatusFrame(op, request_id, status);
    return a;
  }

  size_t PayloadBytes() const {
    return packed ? packed->size() : (values ? values->size() * sizeof(float) : 0);
  }
  const void* PayloadData() const {  // nullptr when there is none
    if (packed) return packed->data();
    return values ? values->data() : nullptr;
  }
  size_t Bytes() const { return head.size() + PayloadBytes(); }
};

// Where a connection's answers go: its transport, which sends them highest priority first.
class AnswerSink {
 public:
  virtual ~AnswerSink() = default;
  // Any thread, never blocking on the network. Dropped when the connection is ending.
  virtual void Send(AnswerFrame answer) = 0;
};

// A request frame as its transport read it.
struct RequestFrame {
  wire::RequestHeader header;  // decoded and checked by its transport
  wire::Chunks chunks;         // the frame's bytes: header, then payload
  // Keeps `chunks` (and `floats`) alive; let go of when the frame is served (a bulk: its last
  // entry) or dropped.
  std::shared_ptr<void> hold;
  // The payload as whole floats that the server may take over (a first push), or nullptr.
  std::vector<float>* floats = nullptr;
};

// Takes the request frames a server link reads (the connection's front door).
class RequestReceiver {
 public:
  virtual ~RequestReceiver() = default;
  // One whole request frame, on the link's reading thread, in arrival order. `nothing_behind`:
  // no byte of a next frame has arrived (serving it on this thread overtakes nothing).
  virtual void OnRequest(RequestFrame frame, bool nothing_behind) = 0;
  // Drops the requests not started yet, letting go of what they hold: the link ended and its
  // threads were joined, or the server is stopping (the TCP listener's reaping and Stop).
  virtual void Clear() {}
};

}  // namespace trellis::link
