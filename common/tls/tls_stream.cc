#include "common/tls/tls_stream.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include "common/tls/tls.h"

namespace trellis {
namespace {

// Plaintext per SSL_write call: bounds how long the writer holds ssl_mu_ (the reader waits).
constexpr size_t kWriteChunk = 256 << 10;
// iov pieces below this are gathered: a 48-byte frame header alone would be a record of its own.
constexpr size_t kGatherBelow = 16 << 10;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

Status LoadIdentity(SSL_CTX* ctx, const TlsCredentials& c) {
  BioPtr bio = MemBio(c.cert_pem);
  X509* leaf = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr);
  if (leaf == nullptr) {
    return InvalidArgumentError("TLS certificate file: no PEM certificate (" + OpenSslErrors() + ")");
  }
  int ok = SSL_CTX_use_certificate(ctx, leaf);
  X509_free(leaf);
  if (ok != 1) return InvalidArgumentError("TLS certificate: " + OpenSslErrors());
  // The rest of the file is the chain up to the CA.
  while (X509* extra = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      return InvalidArgumentError("TLS certificate chain: " + OpenSslErrors());
    }
  }
  ERR_clear_error();  // the end of the chain reads as "no start line"
  BioPtr kb = MemBio(c.key_pem);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, nullptr);
  if (key == nullptr) {
    return InvalidArgumentError("TLS key file: no PEM private key (" + OpenSslErrors() + ")");
  }
  ok = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (ok != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgumentError("TLS key file does not match the certificate: " + OpenSslErrors());
  }
  return Status::Ok();
}

Status LoadCa(SSL_CTX* ctx, const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int n = 0;
  while (X509* ca = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    int ok = X509_STORE_add_cert(store, ca);
    X509_free(ca);
    if (ok != 1) return InvalidArgumentError("TLS CA file: " + OpenSslErrors());
    ++n;
  }
  ERR_clear_error();
  if (n == 0) return InvalidArgumentError("TLS CA file: no PEM certificate");
  return Status::Ok();
}

// OpenSSL writes with write(2)/sendmsg without MSG_NOSIGNAL: a peer that went away would raise
// SIGPIPE and kill the process. SIGPIPE is blocked in this thread around each SSL call that may
// write, and one it raised is taken back before the mask is restored; the call reports EPIPE.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

int64_t MsLeft(std::chrono::steady_clock::time_point deadline) {
  return std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(
                                  deadline - std::chrono::steady_clock::now())
                                  .count());
}

}  // namespace

std::string OpenSslErrors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

StatusOr<std::shared_ptr<const TlsContext>> TlsContext::Create(const TlsCredentials& creds,
                                                               Side side) {
  SSL_CTX* ctx = SSL_CTX_new(side == Side::kServer ? TLS_server_method() : TLS_client_method());
  if (ctx == nullptr) return InternalError("SSL_CTX_new: " + OpenSslErrors());
  std::shared_ptr<const TlsContext> out(new TlsContext(ctx, side, creds.server_name));
  // Both ends are ours: TLS 1.3 only (AES-GCM suites, which the kernel's tls module takes).
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
#ifdef SSL_OP_ENABLE_KTLS
  SSL_CTX_set_options(ctx, SSL_OP_ENABLE_KTLS);
#endif
  // No resumption: tickets would be post-handshake records the kernel's receive side hands back
  // as control messages, and every connection lives for the whole job anyway.
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
  TRELLIS_RETURN_IF_ERROR(LoadIdentity(ctx, creds));
  TRELLIS_RETURN_IF_ERROR(LoadCa(ctx, creds.ca_pem));
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  return out;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

StatusOr<std::unique_ptr<TlsStream>> TlsStream::Begin(const TlsContext& ctx, int fd) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return UnavailableError(std::string("fcntl: ") + std::strerror(errno));
  }
  SSL* ssl = SSL_new(ctx.get());
  if (ssl == nullptr) return InternalError("SSL_new: " + OpenSslErrors());
  std::unique_ptr<TlsStream> s(new TlsStream(ssl, fd));
  if (SSL_set_fd(ssl, fd) != 1) return InternalError("SSL_set_fd: " + OpenSslErrors());
  if (ctx.side() == TlsContext::Side::kClient) {
    SSL_set_connect_state(ssl);
    SSL_set_tlsext_host_name(ssl, ctx.server_name().c_str());
    if (SSL_set1_host(ssl, ctx.server_name().c_str()) != 1) {
      return InternalError("SSL_set1_host: " + OpenSslErrors());
    }
  } else {
    SSL_set_accept_state(ssl);
  }
  return s;
}

Status TlsStream::Continue(short* wait) {
  // Uncontended (the stream is not shared before its handshake ends); held for the analysis.
  MutexLock lock(&ssl_mu_);
  SSL* const ssl = ssl_;
  ERR_clear_error();
  int r;
  {
    SigpipeBlock no_sigpipe;
    r = SSL_do_handshake(ssl);
  }
  if (r == 1) {
    *wait = 0;
    ktls_send_ = BIO_get_ktls_send(SSL_get_wbio(ssl)) > 0;
    ktls_recv_ = BIO_get_ktls_recv(SSL_get_rbio(ssl)) > 0;
    return Status::Ok();
  }
  int e = SSL_get_error(ssl, r);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    *wait = e == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN;
    return Status::Ok();
  }
  long verify = SSL_get_verify_result(ssl);
  std::string why = OpenSslErrors();
  if (verify != X509_V_OK) {
    return UnauthenticatedError(std::string("TLS handshake: peer certificate refused: ") +
                                X509_verify_cert_error_string(verify));
  }
  if (why.find("certificate") != std::string::npos || why.find("alert") != std::string::npos) {
    return UnauthenticatedError("TLS handshake refused: " + why);
  }
  if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN) {
    return UnavailableError("TLS handshake: connection closed by the peer (" + why + ")");
  }
  return UnavailableError("TLS handshake failed: " + why);
}

StatusOr<std::unique_ptr<TlsStream>> TlsStream::Handshake(const TlsContext& ctx, int fd,
                                                          int64_t timeout_ms) {
  TRELLIS_ASSIGN_OR_RETURN(std::unique_ptr<TlsStream> s, Begin(ctx, fd));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    short wait = 0;
    TRELLIS_RETURN_IF_ERROR(s->Continue(&wait));
    if (wait == 0) return s;
    int64_t left = MsLeft(deadline);
    if (left == 0) return DeadlineExceededError("TLS handshake timed out");
    TRELLIS_RETURN_IF_ERROR(
        s->WaitFor(wait == POLLOUT ? SSL_ERROR_WANT_WRITE : SSL_ERROR_WANT_READ, left));
  }
}

TlsStream::~TlsStream() { SSL_free(ssl_); }

std::string TlsStream::OffloadName() const {
  if (ktls_send_ && ktls_recv_) return "kTLS send+recv";
  if (ktls_send_) return "kTLS send, user-space recv";
  if (ktls_recv_) return "user-space send, kTLS recv";
  return "user space";
}

Status TlsStream::WaitFor(int ssl_error, int64_t timeout_ms) {
  pollfd p{fd_, static_cast<short>(ssl_error == SSL_ERROR_WANT_WRITE ? POLLOUT : POLLIN), 0};
  int timeout = timeout_ms < 0 ? -1 : static_cast<int>(std::min<int64_t>(timeout_ms, INT_MAX));
  while (true) {
    int r = poll(&p, 1, timeout);
    if (r > 0) return Status::Ok();  // readable, writable, or an error/hang-up the call reports
    if (r == 0) return DeadlineExceededError("no data within " + std::to_string(timeout_ms) + " ms");
    if (errno != EINTR) return UnavailableError(std::string("poll: ") + std::strerror(errno));
  }
}

Status TlsStream::Read(void* dst, size_t n, bool wait, size_t* got) {
  *got = 0;
  if (n == 0) return Status::Ok();
  while (true) {
    int e;
    {
      MutexLock lock(&ssl_mu_);
      ERR_clear_error();
      size_t read = 0;
      if (SSL_read_ex(ssl_, dst, n, &read) == 1) {
        *got = read;
        return Status::Ok();
      }
      e = SSL_get_error(ssl_, 0);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        if (e == SSL_ERROR_ZERO_RETURN) return UnavailableError("connection closed by the peer");
        std::string why = e == SSL_ERROR_SYSCALL && errno != 0 ? std::strerror(errno)
                                                                 : OpenSslErrors();
        return UnavailableError("TLS read: " + why);
      }
    }
    if (!wait) return Status::Ok();
    const int64_t t = read_timeout_ms_.load();
    TRELLIS_RETURN_IF_ERROR(WaitFor(e, t > 0 ? t : -1));
  }
}

Status TlsStream::WaitReadable() {
  {
    MutexLock lock(&ssl_mu_);
    if (SSL_has_pending(ssl_)) return Status::Ok();
  }
  return WaitFor(SSL_ERROR_WANT_READ, -1);
}

Status TlsStream::WriteBytes(const uint8_t* p, size_t n) {
  while (n > 0) {
    int e;
    {
      MutexLock lock(&ssl_mu_);
      SigpipeBlock no_sigpipe;
      ERR_clear_error();
      size_t written = 0;
      if (SSL_write_ex(ssl_, p, std::min(n, kWriteChunk), &written) == 1) {
        p += written;
        n -= written;
        continue;
      }
      e = SSL_get_error(ssl_, 0);
      if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
        std::string why = e == SSL_ERROR_SYSCALL && errno != 0 ? std::strerror(errno)
                                                                 : OpenSslErrors();
        return UnavailableError("TLS write: " + why);
      }
    }
    TRELLIS_RETURN_IF_ERROR(WaitFor(e, -1));
  }
  return Status::Ok();
}

Status TlsStream::WriteAll(const struct iovec* iov, int iovcnt) {
  gather_.clear();
  for (int i = 0; i < iovcnt; ++i) {
    const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
    const size_t n = iov[i].iov_len;
    if (n < kGatherBelow) {
      gather_.insert(gather_.end(), p, p + n);
      if (gather_.size() >= kGatherBelow) {
        TRELLIS_RETURN_IF_ERROR(WriteBytes(gather_.data(), gather_.size()));
        gather_.clear();
      }
      continue;
    }
    if (!gather_.empty()) {
      TRELLIS_RETURN_IF_ERROR(WriteBytes(gather_.data(), gather_.size()));
      gather_.clear();
    }
    TRELLIS_RETURN_IF_ERROR(WriteBytes(p, n));
  }
  if (!gather_.empty()) TRELLIS_RETURN_IF_ERROR(WriteBytes(gather_.data(), gather_.size()));
  gather_.clear();
  return Status::Ok();
}

}  // namespace trellis
