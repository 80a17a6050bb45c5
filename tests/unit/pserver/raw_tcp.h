// A raw client of the parameter server's TCP listener for tests, the TCP twin of raw_stream.h:
// sends a hello and arbitrary bytes (optionally through mutual TLS), reads answer frames; every
// wait bounded.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tls/tls.h"
#include "common/tls/tls_stream.h"
#include "datapath/tcp/wire.h"
#include "datapath/frame.h"
#include "tests/unit/pserver/raw_stream.h"

namespace trellis::testing {

class RawTcp {
 public:
  explicit RawTcp(int port) {
    auto fd = tcpwire::Connect("127.0.0.1", port, 10000);
    fd_ = fd.ok() ? *fd : -1;
  }
  // Through the server's local socket (tcp_wire.h) instead of its TCP port.
  explicit RawTcp(const std::string& local_name) {
    auto fd = tcpwire::ConnectLocal(local_name);
    fd_ = fd.ok() ? *fd : -1;
  }
  ~RawTcp() {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
  }
  RawTcp(const RawTcp&) = delete;
  RawTcp& operator=(const RawTcp&) = delete;

  int fd() const { return fd_; }
  // Mutual TLS with `tls`'s client certificate; the rest of the traffic goes through it.
  Status StartTls(const TlsCredentials& tls) {
    if (fd_ < 0) return UnavailableError("not connected");
    auto s = TlsStream::Handshake(*tls.client_ctx, fd_, 10000);
    if (!s.ok()) return s.status();
    tls_ = std::move(*s);
    return Status::Ok();
  }
  bool Write(const std::vector<uint8_t>& bytes) {
    if (fd_ < 0) return false;
    iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
    return tcpwire::SendAll(fd_, tls_.get(), &iov, 1).ok();
  }
  // Sends the hello and reads the server's verdict (code 0: accepted).
  bool Hello(const std::string& token, int32_t rank, Answer* verdict) {
    return Write(tcpwire::EncodeHello(token, rank)) && Read(verdict);
  }
  // One answer frame within `timeout_ms` per piece.
  bool Read(Answer* a, int timeout_ms = 20000) {
    uint8_t head[wire::kResponseHeaderBytes];
    if (!ReadExactly(head, sizeof head, timeout_ms)) return false;
    if (!wire::ParseResponseHeader(head, &a->header).ok()) return false;
    a->message.assign(a->header.message_bytes, '\0');
    if (!ReadExactly(a->message.data(), a->message.size(), timeout_ms)) return false;
    a->payload.resize(a->header.payload_bytes);
    if (!ReadExactly(a->payload.data(), a->payload.size(), timeout_ms)) return false;
    a->values.resize(a->payload.size() / sizeof(float));
    if (!a->values.empty()) std::memcpy(a->values.data(), a->payload.data(), a->payload.size());
    return true;
  }
  // Whether the server closed the connection (EOF or reset) within `timeout_ms`; bytes before
  // the end are skipped.
  bool ClosedWithin(int timeout_ms) {
    char buf[4096];
    while (true) {
      size_t got = 0;
      Status st = Some(buf, sizeof buf, &got);
      if (!st.ok()) return true;
      if (got > 0) continue;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, timeout_ms) <= 0) return false;
    }
  }

 private:
  // What is there now, without waiting: *got = 0 when nothing; an error once the peer is gone.
  Status Some(void* dst, size_t n, size_t* got) {
    *got = 0;
    if (tls_) return tls_->Read(dst, n, /*wait=*/false, got);
    ssize_t r = recv(fd_, dst, n, MSG_DONTWAIT);
    if (r > 0) *got = static_cast<size_t>(r);
    if (r == 0) return UnavailableError("closed");
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return UnavailableError(std::strerror(errno));
    }
    return Status::Ok();
  }
  bool ReadExactly(void* dst, size_t n, int timeout_ms) {
    auto* d = static_cast<uint8_t*>(dst);
    while (n > 0) {
      size_t got = 0;
      if (!Some(d, n, &got).ok()) return false;
      if (got == 0) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return false;
        continue;
      }
      d += got;
      n -= got;
    }
    return true;
  }

  int fd_ = -1;
  std::unique_ptr<TlsStream> tls_;
};

}  // namespace trellis::testing
