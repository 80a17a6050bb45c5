// A SchedulerClient reconnecting through a slow path: a loopback proxy in front of a real
// scheduler holds every new connection for longer than a second before passing bytes on (a
// loaded node, a scheduler pod that is slow to answer after its restart). The client's
// reconnect back-off is capped at 1 s; its connection attempts must not be cut at that scale,
// or it never gets through (gRPC's MIN_RECONNECT_BACKOFF is also the minimum connect timeout).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <list>
#include <mutex>
#include <thread>

#include "scheduler/scheduler_client.h"
#include "tests/testing/test_scheduler.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

// Forwards 127.0.0.1:port() to 127.0.0.1:target after holding each new connection `delay`.
class SlowProxy {
 public:
  explicit SlowProxy(int target) : target_(target) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(listen_fd_, 64) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "proxy cannot listen";
    }
    port_ = ntohs(a.sin_port);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~SlowProxy() {
    stop_ = true;
    ::shutdown(listen_fd_, SHUT_RDWR);
    accept_.join();
    DropAll();
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  void set_delay(std::chrono::milliseconds d) { delay_ms_ = static_cast<int>(d.count()); }
  // Closes every forwarded connection (the scheduler going away, as seen by the client).
  void DropAll() {
    std::list<std::thread> pumps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
      pumps.swap(pumps_);
    }
    for (auto& t : pumps) t.join();
  }

 private:
  void AcceptLoop() {
    while (!stop_) {
      int c = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(c);
      pumps_.emplace_back([this, c] { Pump(c); });
    }
  }
  void Pump(int c) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms_.load());
    while (!stop_ && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(10ms);
    int u = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(target_));
    {
      std::lock_guard<std::mutex> lock(mu_);
      fds_.push_back(u);
    }
    if (!stop_ && ::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      char buf[65536];
      while (true) {
        pollfd p[2] = {{c, POLLIN, 0}, {u, POLLIN, 0}};
        if (::poll(p, 2, 100) < 0) break;
        if (stop_) break;
        bool closed = false;
        for (int i = 0; i < 2 && !closed; ++i) {
          if (p[i].revents == 0) continue;
          ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
          if (n <= 0 || ::send(p[1 - i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n) closed = true;
        }
        if (closed) break;
      }
    }
    ::shutdown(c, SHUT_RDWR);
    ::shutdown(u, SHUT_RDWR);
  }

  const int target_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> delay_ms_{0};
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> fds_;        // GUARDED_BY(mu_); closed by the destructor only
  std::list<std::thread> pumps_;  // GUARDED_BY(mu_)
};

TEST(SchedulerReconnectTest, ASlowConnectionAttemptIsNotCutShort) {
  SchedulerConfig config;
  config.job_name = "mlp";
  config.num_servers = 1;
  config.num_workers = 1;
  auto sched = testing::StartTestScheduler(config, "tok");
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  SlowProxy proxy((*sched)->port());
  auto client = SchedulerClient::Connect({"127.0.0.1:" + std::to_string(proxy.port()), "tok", 20s});
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Ping().ok());

  // The scheduler "restarts": connections drop, and new ones take 1.5 s to be answered.
  proxy.set_delay(1500ms);
  proxy.DropAll();
  const auto start = std::chrono::steady_clock::now();
  Status last;
  while (std::chrono::steady_clock::now() - start < 15s) {
    auto ping = (*client)->Ping();
    last = ping.status();
    if (ping.ok()) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(last.ok()) << "the client never got through a 1.5 s handshake in 15 s: " << last.ToString();
}

}  // namespace
}  // namespace trellis
