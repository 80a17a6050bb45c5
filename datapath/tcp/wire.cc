#include "datapath/tcp/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <charconv>
#include <chrono>
#include <cstring>
#include <cstddef>

#include "common/base/net.h"
#include "datapath/address.h"
#include "datapath/le_bytes.h"

namespace trellis::tcpwire {
namespace {

using wire::GetLe;
using wire::PutLe;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Below this a read goes through the read-ahead buffer; above, straight into the destination.
constexpr size_t kDirectMin = 16 << 10;

}  // namespace

std::vector<uint8_t> EncodeHello(const std::string& token, int32_t rank) {
  std::vector<uint8_t> out(kHelloFixedBytes + token.size());
  PutLe<uint32_t>(out.data(), 0, kHelloMagic);
  PutLe<uint32_t>(out.data(), 4, kHelloVersion);
  PutLe<int32_t>(out.data(), 8, rank);
  PutLe<uint32_t>(out.data(), 12, static_cast<uint32_t>(token.size()));
  if (!token.empty()) std::memcpy(out.data() + kHelloFixedBytes, token.data(), token.size());
  return out;
}

Status CheckHelloFixed(const uint8_t* fixed, uint32_t* token_bytes) {
  const auto magic = GetLe<uint32_t>(fixed, 0);
  const auto version = GetLe<uint32_t>(fixed, 4);
  *token_bytes = GetLe<uint32_t>(fixed, 12);
  if (magic != kHelloMagic) {
    return InvalidArgumentError("bad hello: not a trellis data connection (bad magic)");
  }
  if (version != kHelloVersion) {
    return InvalidArgumentError("bad hello: protocol version " + std::to_string(version) +
                                ", this server speaks " + std::to_string(kHelloVersion));
  }
  if (*token_bytes > kMaxTokenBytes) {
    return InvalidArgumentError("bad hello: token of " + std::to_string(*token_bytes) +
                                " bytes (limit " + std::to_string(kMaxTokenBytes) + ")");
  }
  return Status::Ok();
}

Status DecodeHello(const uint8_t* bytes, size_t n, Hello* out) {
  if (n < kHelloFixedBytes) {
    return InvalidArgumentError("bad hello: " + std::to_string(n) + " bytes, shorter than " +
                                std::to_string(kHelloFixedBytes));
  }
  uint32_t token_len = 0;
  TRELLIS_RETURN_IF_ERROR(CheckHelloFixed(bytes, &token_len));
  if (n != kHelloFixedBytes + token_len) {
    return InvalidArgumentError("bad hello: " + std::to_string(n) + " bytes for a token of " +
                                std::to_string(token_len));
  }
  out->rank = GetLe<int32_t>(bytes, 8);
  out->token.assign(reinterpret_cast<const char*>(bytes) + kHelloFixedBytes, token_len);
  return Status::Ok();
}

Status DecodeRequestHeader(const uint8_t* h, uint64_t max_payload, wire::RequestHeader* out) {
  if (Status st = wire::ParseRequestHeader(h, out); !st.ok()) {
    return Status(st.code(), st.message() + "; closing the connection");
  }
  if (out->payload_bytes > max_payload) {
    return InvalidArgumentError("malformed frame: payload of " +
                                std::to_string(out->payload_bytes) + " bytes exceeds the " +
                                std::to_string(max_payload) +
                                "-byte limit (sliceBytes); closing the connection");
  }
  if (wire::PayloadIsFloat32(out->op) && out->payload_bytes % sizeof(float) != 0) {
    return InvalidArgumentError("malformed frame: payload of " +
                                std::to_string(out->payload_bytes) +
                                " bytes is not a whole number of float32 values");
  }
  if (!wire::OpHasPayload(out->op) && out->payload_bytes != 0) {
    return InvalidArgumentError(std::string("malformed frame: a ") + wire::OpName(out->op) +
                                " carries no payload, got " + std::to_string(out->payload_bytes) +
                                " bytes");
  }
  return Status::Ok();
}

Status DecodeResponseHeader(const uint8_t* h, uint64_t max_payload, wire::ResponseHeader* out) {
  TRELLIS_RETURN_IF_ERROR(wire::ParseResponseHeader(h, out));
  if (out->message_bytes > kMaxMessageBytes || out->payload_bytes > max_payload) {
    return DataLossError("malformed response: message of " + std::to_string(out->message_bytes) +
                         " bytes, payload of " + std::to_string(out->payload_bytes) +
                         " bytes (limits " + std::to_string(kMaxMessageBytes) + ", " +
                         std::to_string(max_payload) + ")");
  }
  return Status::Ok();
}

void TuneSocket(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int bytes = kSocketBufferBytes;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

StatusOr<int> Listen(const std::string& host, int port, int* bound_port) {
  // Accepted sockets inherit the receive buffer; setting it before listen sizes the window.
  return ListenTcp(host, port, bound_port, [](int fd) { TuneSocket(fd); });
}

namespace {

// A Unix stream socket (with `flags`) and the abstract-namespace address of `name` in *a:
// sun_path = NUL, then the name (no terminator). The name is checked first: it bounds the copy.
StatusOr<int> LocalSocket(const std::string& name, int flags, sockaddr_un* a, socklen_t* len) {
  TRELLIS_RETURN_IF_ERROR(CheckLocalName(name));
  *a = sockaddr_un{};
  a->sun_family = AF_UNIX;
  std::memcpy(a->sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
  if (fd < 0) return UnavailableError(Errno("local socket"));
  TuneSocket(fd);
  return fd;
}

}  // namespace

StatusOr<int> ListenLocal(const std::string& name) {
  sockaddr_un a;
  socklen_t len = 0;
  TRELLIS_ASSIGN_OR_RETURN(int fd, LocalSocket(name, 0, &a, &len));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(fd, 128) != 0) {
    Status st = UnavailableError(Errno(("local socket @" + name).c_str()));
    ::close(fd);
    return st;
  }
  return fd;
}

StatusOr<int> ConnectLocal(const std::string& name) {
  sockaddr_un a;
  socklen_t len = 0;
  // Non-blocking while connecting: a listener whose backlog is full answers EAGAIN at once
  // instead of holding the caller.
  TRELLIS_ASSIGN_OR_RETURN(int fd, LocalSocket(name, SOCK_NONBLOCK, &a, &len));
  int r;
  do {
    r = connect(fd, reinterpret_cast<sockaddr*>(&a), len);
  } while (r != 0 && errno == EINTR);
  if (r != 0) {
    Status st = UnavailableError(Errno(("connect to local socket @" + name).c_str()));
    ::close(fd);
    return st;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

StatusOr<int> Connect(const std::string& host, int port, int64_t timeout_ms) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) return UnavailableError("cannot resolve '" + host + "': " + gai_strerror(rc));
  std::string last = "no address";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    TuneSocket(fd);
    int r = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      pollfd p{fd, POLLOUT, 0};
      int pr = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX)));
      int err = 0;
      socklen_t len = sizeof err;
      if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        r = 0;
      } else {
        errno = pr == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
      }
    }
    if (r != 0) {
      last = Errno("connect");
      ::close(fd);
      continue;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return UnavailableError("cannot connect to " + host + ":" + service + ": " + last);
}

void SkipSent(size_t n, struct iovec** iov, int* iovcnt) {
  while (*iovcnt > 0 && n >= (*iov)->iov_len) {
    n -= (*iov)->iov_len;
    ++*iov;
    --*iovcnt;
  }
  if (*iovcnt > 0) {
    (*iov)->iov_base = static_cast<uint8_t*>((*iov)->iov_base) + n;
    (*iov)->iov_len -= n;
  }
}

namespace {

// The sendmsg loop under SendAll and SendNow: resumes partial sends; with MSG_DONTWAIT in `flags`
// a full socket ends it (OK, *sent short), without it EAGAIN is the send timeout (an error).
Status SendLoop(int fd, struct iovec* iov, int iovcnt, int flags, size_t* sent) {
  *sent = 0;
  while (iovcnt > 0) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(std::min(iovcnt, IOV_MAX));
    ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL | flags);
    if (n < 0) {
      if (errno == EINTR) continue;
      if ((flags & MSG_DONTWAIT) != 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return UnavailableError(Errno("send"));
    }
    *sent += static_cast<size_t>(n);
    SkipSent(static_cast<size_t>(n), &iov, &iovcnt);
  }
  return Status::Ok();
}

}  // namespace

Status SendAll(int fd, struct iovec* iov, int iovcnt) {
  size_t sent = 0;
  return SendLoop(fd, iov, iovcnt, 0, &sent);
}

Status SendNow(int fd, struct iovec* iov, int iovcnt, size_t* sent) {
  return SendLoop(fd, iov, iovcnt, MSG_DONTWAIT, sent);
}

Status SendAll(int fd, TlsStream* tls, struct iovec* iov, int iovcnt) {
  return tls != nullptr ? tls->WriteAll(iov, iovcnt) : SendAll(fd, iov, iovcnt);
}

SocketReader::SocketReader(int fd, size_t buffer_bytes, TlsStream* tls)
    : fd_(fd), tls_(tls), buf_(buffer_bytes) {}

Status SocketReader::RecvSome(void* dst, size_t n, int flags, size_t* got) {
  if (tls_ != nullptr) return tls_->Read(dst, n, (flags & MSG_DONTWAIT) == 0, got);
  while (true) {
    ssize_t r = recv(fd_, dst, n, flags);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return Status::Ok();
    }
    if (r == 0) return UnavailableError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      // Without MSG_DONTWAIT this is the receive timeout (SO_RCVTIMEO) expiring: an error, not
      // "0 bytes", which Fill would retry for ever.
      if ((flags & MSG_DONTWAIT) == 0) {
        return DeadlineExceededError("no data within the receive timeout");
      }
      *got = 0;
      return Status::Ok();
    }
    return UnavailableError(Errno("recv"));
  }
}

Status SocketReader::Fill() {
  begin_ = end_ = 0;
  size_t got = 0;
  while (got == 0) TRELLIS_RETURN_IF_ERROR(RecvSome(buf_.data(), buf_.size(), 0, &got));
  end_ = got;
  return Status::Ok();
}

Status SocketReader::Read(void* dst, size_t n, link::WriteGuard* guard) {
  auto* d = static_cast<uint8_t*>(dst);
  bool writable = true;
  // Runs `fn(target)` with the guard held; target is nullptr once the guard refused.
  auto piece = [&](auto fn) -> Status {
    if (writable && guard != nullptr && !guard->Begin()) writable = false;
    Status st = fn(writable ? d : nullptr);
    if (writable && guard != nullptr) guard->End();
    return st;
  };
  while (n > 0) {
    if (begin_ < end_) {
      size_t take = std::min(n, end_ - begin_);
      TRELLIS_RETURN_IF_ERROR(piece([&](uint8_t* t) {
        if (t != nullptr) std::memcpy(t, buf_.data() + begin_, take);
        return Status::Ok();
      }));
      begin_ += take;
      d += take;
      n -= take;
      continue;
    }
    if (n < kDirectMin || !writable) {
      TRELLIS_RETURN_IF_ERROR(Fill());
      continue;
    }
    size_t got = 0;
    if (guard == nullptr) {
      TRELLIS_RETURN_IF_ERROR(RecvSome(d, n, MSG_WAITALL, &got));
    } else {
      // Never block while holding the guard: the other side of it (completing the operation)
      // must not wait on the network.
      TRELLIS_RETURN_IF_ERROR(piece([&](uint8_t* t) {
        return t == nullptr ? Status::Ok() : RecvSome(t, n, MSG_DONTWAIT, &got);
      }));
      if (!writable) continue;
      if (got == 0) {
        if (tls_ != nullptr) {
          // Decrypted bytes may wait inside the TLS stream while the socket is quiet.
          TRELLIS_RETURN_IF_ERROR(tls_->WaitReadable());
          continue;
        }
        pollfd p{fd_, POLLIN, 0};
        while (poll(&p, 1, -1) < 0 && errno == EINTR) {
        }
        continue;
      }
    }
    d += got;
    n -= got;
  }
  return Status::Ok();
}

bool SocketReader::NothingWaiting() const {
  if (tls_ != nullptr || begin_ < end_) return false;
  int queued = 0;
  return ioctl(fd_, FIONREAD, &queued) == 0 && queued == 0;
}

Status SocketReader::Skip(size_t n) {
  while (n > 0) {
    if (begin_ == end_) TRELLIS_RETURN_IF_ERROR(Fill());
    size_t take = std::min(n, end_ - begin_);
    begin_ += take;
    n -= take;
  }
  return Status::Ok();
}

}  // namespace trellis::tcpwire
