#include "bench/pushpull/tcp_echo.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <semaphore>
#include <thread>
#include <vector>

namespace trellis::bench {
namespace {

constexpr int kSocketBuffer = 4 << 20;  // large buffers: what a tuned data path would ask for
constexpr size_t kChunk = 1 << 20;      // bytes per read()/write() call

Status Errno(const std::string& what) { return InternalError(what + ": " + std::strerror(errno)); }

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    Reset();
    fd_ = o.fd_;
    o.fd_ = -1;
    return *this;
  }
  int get() const { return fd_; }
  void Reset() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

void Tune(int fd) {
  int size = kSocketBuffer;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, std::min(n, kChunk));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("write");
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status ReadAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, data, std::min(n, kChunk));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Errno("read");
    }
    if (r == 0) return UnavailableError("echo peer closed the connection");
    data += r;
    n -= static_cast<size_t>(r);
  }
  return Status::Ok();
}

// Echoes everything it reads on one accepted connection until the peer closes.
void EchoLoop(int fd) {
  std::vector<char> buf(kChunk);
  for (;;) {
    const ssize_t r = read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return;
    if (!WriteAll(fd, buf.data(), static_cast<size_t>(r)).ok()) return;
  }
}

}  // namespace

StatusOr<TcpEchoResult> MeasureTcpEcho(uint64_t message_bytes, const Budget& budget) {
  Fd listener(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return Errno("socket");
  Tune(listener.get());  // accepted sockets inherit the buffer sizes
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("bind");
  if (listen(listener.get(), 1) != 0) return Errno("listen");
  socklen_t len = sizeof(addr);
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return Errno("getsockname");

  Fd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (client.get() < 0) return Errno("socket");
  Tune(client.get());
  if (connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return Errno("connect");
  Fd served(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (served.get() < 0) return Errno("accept");
  TcpEchoResult result;
  socklen_t optlen = sizeof(result.socket_buffer_bytes);
  getsockopt(client.get(), SOL_SOCKET, SO_SNDBUF, &result.socket_buffer_bytes, &optlen);

  // Threads: the echo server, and the writer that sends each message while we read its echo.
  std::thread echo([fd = served.get()] { EchoLoop(fd); });
  std::vector<char> out(message_bytes, 'x');
  std::vector<char> in(message_bytes);
  std::counting_semaphore<> go(0);
  std::atomic<bool> stop{false};
  Status writer_status;  // written by the writer, read after join
  std::thread writer([&] {
    for (;;) {
      go.acquire();
      if (stop.load()) return;
      writer_status = WriteAll(client.get(), out.data(), out.size());
      if (!writer_status.ok()) return;
    }
  });

  // The warm-up is inside this window too; it is short next to the measured part.
  const double cpu_start = ProcessCpuSeconds();
  StatusOr<RunResult> run = RunBounded(budget, [&]() -> Status {
    go.release();
    return ReadAll(client.get(), in.data(), in.size());
  });

  const double cpu_s = ProcessCpuSeconds() - cpu_start;
  stop.store(true);
  go.release();
  writer.join();
  shutdown(client.get(), SHUT_RDWR);  // ends the echo loop
  echo.join();
  if (!run.ok()) return run.status();
  TRELLIS_RETURN_IF_ERROR(writer_status);
  result.messages = run->iters;
  result.gbytes_per_s = static_cast<double>(message_bytes) * run->iters / run->seconds / 1e9;
  result.p50_s = run->latencies.Percentile(50);
  result.p99_s = run->latencies.Percentile(99);
  result.cpu_s_per_message = cpu_s / (run->iters + budget.warmup_iters);
  return result;
}

}  // namespace trellis::bench
