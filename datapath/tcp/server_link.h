// The server's side of a raw-TCP link (protocol in wire.h): one worker's connection
// once its hello was accepted (admission.h reads hellos before any thread is spent).
//
// Threads: one reader ("pserver-tcp-rd") and one writer ("pserver-tcp-wr"). The reader answers
// the hello with a welcome, then reads each request frame into a payload buffer of the
// connection (reused, pre-faulted: datapath/payload_buffers.h) and hands it to the receiver. What
// the receiver holds and has not let go of yet is bounded (`read_ahead`), and so are the answers
// not sent yet (its byte limit); past either the reader stops reading and the peer's socket
// fills. Answers (Send, any thread) go out with sendmsg straight from their buffers: by the
// calling thread itself when nothing is queued or being sent, as far as the socket takes it
// without waiting, else (and the rest) by the writer, highest priority first, in batches. Only
// the writer ever waits on the socket, so a worker that stops reading holds up no serving thread.
//
// Errors: bytes that do not parse as a request (bad magic, unknown op, oversized length, a
// truncated frame) get an error frame and the link closes. What was read is still answered
// before the stream closes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/tls/tls_stream.h"
#include "datapath/link.h"

namespace trellis::link {

struct TcpServerLinkOptions {
  std::string peer;       // for log lines
  int32_t worker = 0;     // the rank its hello gave
  uint64_t max_payload = 0;  // a request with a larger payload ends the link
  ReadAheadLimit read_ahead;
  // Runs once, on the link's last thread, after its descriptor was closed (the connection no
  // longer counts against a cap; it may be joined).
  std::function<void()> on_closed;
};

class TcpServerLink : public AnswerSink {
 public:
  // Takes `fd` and `tls` (nullptr: plaintext). Start next. The owner keeps the link (a
  // shared_ptr) until Join returned; answers may hold it longer.
  static std::shared_ptr<TcpServerLink> Create(int fd, std::unique_ptr<TlsStream> tls,
                                               TcpServerLinkOptions options);
  // Starts the writer and the reader, which hands every request frame to `receiver` (held until
  // the link ends). When a thread cannot be created the worker is told UNAVAILABLE, the link
  // ends (on_closed runs) and this is false.
  virtual bool Start(std::shared_ptr<RequestReceiver> receiver) = 0;
  // Ends the link at once (shutdown(2)); its threads end. Idempotent.
  virtual void Kill() = 0;
  virtual bool Ended() const = 0;  // both threads ended
  virtual void Join() = 0;         // joins the threads (call from another thread)
};

}  // namespace trellis::link
