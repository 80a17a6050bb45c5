// The raw-TCP transport's wire and sockets (datapath/tcp/), shared by the worker's link
// (worker_link.h) and the server's side (admission.h, server_link.h, listener.h).
//
// A connection starts with a hello from the worker:
//   u32 magic "TRH1" | u32 version (1) | i32 worker rank | u32 token bytes | token
// The server answers with one response frame (frame.h layout, request id 0): code 0, or an error
// (wrong token, bad rank) after which it closes. Then frames flow exactly as in frame.h — request
// header (48 bytes) + payload one way, response header (40) + message + payload the other —
// back to back on the byte stream, multiplexed by request id.
//
// The server publishes its port inside its data address (datapath/address.h). It may also offer
// a local socket: a Unix stream socket in the abstract namespace under a random name, reachable
// only from its own network namespace (a worker on the same host and network; never from
// another pod or host). The same protocol runs over it, hello and token included; it saves the
// TCP stack's work per byte (docs/performance.md, "The local socket"). A worker that cannot
// reach it connects over TCP.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/tls/tls_stream.h"
#include "datapath/frame.h"
#include "datapath/link.h"

namespace trellis::tcpwire {

inline constexpr uint32_t kHelloMagic = 0x31485254;  // "TRH1" little-endian
inline constexpr uint32_t kHelloVersion = 1;
inline constexpr size_t kHelloFixedBytes = 16;
inline constexpr uint32_t kMaxTokenBytes = 4096;
inline constexpr uint32_t kMaxMessageBytes = wire::kMaxErrorBytes;  // error text in a response
// Socket buffers: big enough for a few MiB in flight per direction (capped by net.core.*mem_max).
inline constexpr int kSocketBufferBytes = 4 << 20;

std::vector<uint8_t> EncodeHello(const std::string& token, int32_t rank);
struct Hello {
  int32_t rank = -1;
  std::string token;
};
// Checks a hello's first kHelloFixedBytes (magic, version, token length at most kMaxTokenBytes)
// and sets *token_bytes, so a reader knows how much more to wait for, or refuses at once.
Status CheckHelloFixed(const uint8_t* fixed, uint32_t* token_bytes);
// Parses a whole hello (`n` = kHelloFixedBytes + its token bytes): magic, version, token length
// (at most kMaxTokenBytes). INVALID_ARGUMENT "bad hello: ..." naming what is wrong.
Status DecodeHello(const uint8_t* bytes, size_t n, Hello* out);

// Checks a request header read from the socket before its payload is read: magic, op, payload
// length within `max_payload` and a whole number of floats, no payload on a pull. Any error
// means the byte stream cannot be trusted any more (the caller closes the connection).
Status DecodeRequestHeader(const uint8_t* h, uint64_t max_payload, wire::RequestHeader* out);
// Same for a response header (worker side).
Status DecodeResponseHeader(const uint8_t* h, uint64_t max_payload, wire::ResponseHeader* out);

// TCP_NODELAY, SO_SNDBUF/SO_RCVBUF = kSocketBufferBytes, SIGPIPE off for sends (MSG_NOSIGNAL).
void TuneSocket(int fd);

// Binds and listens; `*port` = the bound port (0 picks one).
StatusOr<int> Listen(const std::string& host, int port, int* bound_port);
// Connects within `timeout_ms`.
StatusOr<int> Connect(const std::string& host, int port, int64_t timeout_ms);
// The local socket: listens on the abstract Unix name `name` (CheckLocalName, address.h), and
// connects to it (no waiting: a local connect completes or fails at once; UNAVAILABLE when
// nothing listens under that name in this network namespace).
StatusOr<int> ListenLocal(const std::string& name);
StatusOr<int> ConnectLocal(const std::string& name);

// Sends every byte of `iov` (partial sends resumed). `iov` is modified.
Status SendAll(int fd, struct iovec* iov, int iovcnt);
// The same through `tls` when the link runs TLS (nullptr: plain SendAll on `fd`).
Status SendAll(int fd, TlsStream* tls, struct iovec* iov, int iovcnt);
// Sends what the socket takes now without waiting (plaintext only): a thread that must not block
// on a peer (one that may have stopped reading) writes what fits and leaves the rest to a
// writer thread. *sent = the bytes sent, all of them or fewer when the socket's buffer filled.
// `iov` is modified, as by SendAll.
Status SendNow(int fd, struct iovec* iov, int iovcnt, size_t* sent);
// Drops the first `n` bytes of an iovec array (a partial send): *iov and *iovcnt move past the
// whole entries, the first remaining entry is shortened. REQUIRES: n <= the array's bytes.
void SkipSent(size_t n, struct iovec** iov, int* iovcnt);

// Reads a byte stream: small pieces through a read-ahead buffer (few syscalls for headers and
// small frames), big ones straight into the destination (no intermediate copy).
class SocketReader {
 public:
  // With `tls` (outliving the reader) the bytes are read through it: decrypted.
  explicit SocketReader(int fd, size_t buffer_bytes = 64 << 10, TlsStream* tls = nullptr);
  // Exactly `n` bytes into `dst`. With a guard, the socket is only read while the guard is
  // held, never blocking under it (poll first); bytes the guard refuses are discarded.
  // Errors: UNAVAILABLE (peer closed, reset) naming the cause; DEADLINE_EXCEEDED when the
  // socket's receive timeout (SO_RCVTIMEO, or the TLS stream's) expired first.
  Status Read(void* dst, size_t n, link::WriteGuard* guard = nullptr);
  // Reads and drops `n` bytes.
  Status Skip(size_t n);
  // True when no byte waits to be read: none in the read-ahead buffer and none in the socket
  // (FIONREAD). Always false through TLS (decrypted bytes may wait inside the stream).
  bool NothingWaiting() const;

 private:
  Status Fill();                      // at least one byte into the buffer (blocking)
  Status RecvSome(void* dst, size_t n, int flags, size_t* got);  // one recv

  const int fd_;
  TlsStream* const tls_;
  std::vector<uint8_t> buf_;
  size_t begin_ = 0;
  size_t end_ = 0;
};

}  // namespace trellis::tcpwire
