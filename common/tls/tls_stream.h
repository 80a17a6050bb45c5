// TLS over a connected TCP socket for the raw data link (OpenSSL 3). The handshake is mutual:
// the server requires a client certificate, both sides verify the peer against the job CA and
// the client checks the server's name. Where the kernel has the `tls` module, OpenSSL hands the
// record layer to it after the handshake (kTLS, SSL_OP_ENABLE_KTLS); ktls_send()/ktls_recv() say
// whether it did. Without it the records are sealed in user space (SSL_read/SSL_write); the
// stream works the same either way.
//
// Threads: one reader and one writer may use a stream at once (the data link's reader and writer
// threads). The socket is non-blocking; each SSL call runs under ssl_mu_ and waiting for the
// socket happens outside it, so neither side holds up the other.
#pragma once

#include <openssl/ssl.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/base/status.h"

namespace trellis {

struct TlsCredentials;  // common/tls/tls.h

class TlsContext {
 public:
  enum class Side { kServer, kClient };
  // Certificate + key + CA from `creds`' PEM text; errors name what did not load.
  static StatusOr<std::shared_ptr<const TlsContext>> Create(const TlsCredentials& creds,
                                                            Side side);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  Side side() const { return side_; }
  SSL_CTX* get() const { return ctx_; }
  const std::string& server_name() const { return server_name_; }

 private:
  TlsContext(SSL_CTX* ctx, Side side, std::string server_name)
      : ctx_(ctx), side_(side), server_name_(std::move(server_name)) {}
  SSL_CTX* const ctx_;
  const Side side_;
  const std::string server_name_;
};

class TlsStream {
 public:
  // Runs the handshake on `fd` (connected; made non-blocking and left so) within `timeout_ms`.
  // `fd` stays the caller's: the stream never closes it. Errors: UNAUTHENTICATED when the peer's
  // certificate is refused (or it sent none), DEADLINE_EXCEEDED, UNAVAILABLE otherwise.
  static StatusOr<std::unique_ptr<TlsStream>> Handshake(const TlsContext& ctx, int fd,
                                                        int64_t timeout_ms);
  // The same handshake for an event loop that must never wait on one peer (the TCP data
  // listener): Begin makes `fd` non-blocking and returns a stream whose handshake has not run;
  // each Continue runs it as far as the socket allows and sets *wait to 0 once done, else to
  // POLLIN or POLLOUT: call again when the socket is so. Errors as Handshake's.
  static StatusOr<std::unique_ptr<TlsStream>> Begin(const TlsContext& ctx, int fd);
  Status Continue(short* wait);
  ~TlsStream();
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;

  bool ktls_send() const { return ktls_send_; }
  bool ktls_recv() const { return ktls_recv_; }
  // "kTLS send+recv", "kTLS send, user-space recv", "user space" (for logs and the bench).
  std::string OffloadName() const;

  // Up to `n` plaintext bytes into `dst`: at least one when `wait`, else possibly none (*got=0).
  // UNAVAILABLE when the peer closed or the connection broke; DEADLINE_EXCEEDED when a read
  // timeout is set and nothing came within it.
  Status Read(void* dst, size_t n, bool wait, size_t* got);
  // Returns once Read would find data (decrypted bytes pending or the socket readable).
  Status WaitReadable();
  // Every byte of `iov` (small pieces are gathered into few records).
  Status WriteAll(const struct iovec* iov, int iovcnt);
  // Bounds each blocking wait of Read (0: none); e.g. for the hello of an unauthenticated peer.
  void set_read_timeout_ms(int64_t ms) { read_timeout_ms_.store(ms); }

 private:
  TlsStream(SSL* ssl, int fd) : ssl_(ssl), fd_(fd) {}
  Status WriteBytes(const uint8_t* p, size_t n);
  // Waits (outside ssl_mu_) for what SSL_get_error asked for; timeout_ms < 0: none.
  Status WaitFor(int ssl_error, int64_t timeout_ms) EXCLUDES(ssl_mu_);

  Mutex ssl_mu_;
  SSL* const ssl_ GUARDED_BY(ssl_mu_);  // every SSL call holds ssl_mu_
  const int fd_;
  bool ktls_send_ = false;
  bool ktls_recv_ = false;
  std::atomic<int64_t> read_timeout_ms_{0};
  std::vector<uint8_t> gather_;  // writer thread only: small iov pieces joined into one record
};

// The OpenSSL error queue as text (drains it).
std::string OpenSslErrors();

}  // namespace trellis
