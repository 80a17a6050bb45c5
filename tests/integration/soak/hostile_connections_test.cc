// Unauthenticated connections against a live job (issue 16 §1, "Must show"): trellis-mlp under
// trellis-launch (1 server x 2 workers). While it trains, a few hundred idle and slow connections
// hold its parameter server's TCP data port and its /metrics port: silent ones, and ones that
// trickle a hello (or an HTTP request) a byte a second, each reopened whenever the server closes
// it. The job must end exactly as the same job run undisturbed beside it (the same accuracy, the
// very same final weights and momentum); the server must spend no thread on them and close the
// data port's ones at the hello deadline (10 s); /metrics must still answer a scrape.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/fault/mlp_outcome.h"
#include "tests/integration/job_processes.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

// mlp-tiny in small batches, so that training outlasts the hello deadline (10 s) with time to
// spare (15-20 s on an idle 2-core machine): 32768 samples in batches of 8 over 2 workers are 2048 steps per
// epoch, 8 epochs; a checkpoint every 1024 steps (the final model).
constexpr int kSteps = 8 * 2048;

std::string JobYaml(const std::string& name, const std::string& ckpt_dir) {
  return MlpJobYaml(name, {.servers = 1, .epochs = 8, .batch = 8, .train_samples = 32768, .checkpoint = ckpt_dir,
                          .interval_steps = 1024, .run_policy = "    backoffLimit: 0\n    activeDeadlineSeconds: 80\n"});
}

int Threads(pid_t pid) {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

int ConnectNonBlocking(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Connections held open against ports on loopback, from one thread: `idle` say nothing, `slow`
// send one byte of `trickle` a second; each is reopened whenever the server ends it.
class Flood {
 public:
  struct Target {
    int port;
    int idle;
    int slow;
    std::string trickle;
  };
  explicit Flood(std::vector<Target> targets) : targets_(std::move(targets)) {
    EXPECT_LE(targets_.size(), closed_.size());
    for (size_t t = 0; t < targets_.size(); ++t) {
      for (int i = 0; i < targets_[t].idle + targets_[t].slow; ++i) {
        conns_.push_back({-1, t, i >= targets_[t].idle, 0});
      }
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~Flood() {
    stop_ = true;
    thread_.join();
    for (auto& c : conns_) {
      if (c.fd >= 0) ::close(c.fd);
    }
  }
  int64_t opened() const { return opened_.load(); }
  // Connections of target `t` the server closed (FIN; refusals and resets not counted).
  int64_t closed(size_t t) const { return closed_[t].load(); }
  size_t size() const { return conns_.size(); }

 private:
  struct Conn {
    int fd;
    size_t target;
    bool slow;
    size_t sent;
  };
  void Loop() {
    auto next_byte = std::chrono::steady_clock::now();
    auto next_connect = next_byte;
    std::vector<pollfd> fds;
    while (!stop_) {
      // Reopened at most ten times a second (a server that is gone refuses at once).
      if (std::chrono::steady_clock::now() >= next_connect) {
        next_connect = std::chrono::steady_clock::now() + 100ms;
        for (auto& c : conns_) {
          if (c.fd < 0 && (c.fd = ConnectNonBlocking(targets_[c.target].port)) >= 0) {
            c.sent = 0;
            ++opened_;
          }
        }
      }
      if (std::chrono::steady_clock::now() >= next_byte) {
        next_byte += 1s;
        for (auto& c : conns_) {
          if (c.fd < 0 || !c.slow) continue;
          const std::string& t = targets_[c.target].trickle;
          if (::send(c.fd, &t[c.sent % t.size()], 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) ++c.sent;
        }
      }
      fds.clear();
      for (auto& c : conns_) fds.push_back({c.fd, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < conns_.size(); ++i) {
        if (conns_[i].fd < 0 || fds[i].revents == 0) continue;
        char buf[4096];
        ssize_t n = ::recv(conns_[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) continue;  // an answer
        if (n == 0) ++closed_[conns_[i].target];  // not a refusal or a reset: a close
        ::close(conns_[i].fd);
        conns_[i].fd = -1;
      }
    }
  }

  const std::vector<Target> targets_;
  std::vector<Conn> conns_;  // the flood thread's
  std::array<std::atomic<int64_t>, 2> closed_{};  // per target
  std::atomic<int64_t> opened_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// GET /metrics within `timeout_ms`: the whole answer, or "" when none came.
std::string Scrape(int port, int timeout_ms) {
  int fd = ConnectNonBlocking(port);
  if (fd < 0) return "";
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  size_t sent = 0;
  std::string out;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, static_cast<short>(sent < req.size() ? POLLOUT : POLLIN), 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (sent < req.size()) {
      ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
      continue;
    }
    char buf[16384];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// A data-port hello as the wire has it ("TRH1", version 1, rank 0, a 64-byte token), never
// finished within the deadline at a byte a second.
std::string SlowHello() {
  std::string h = {'T', 'R', 'H', '1', 1, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0};
  return h + std::string(64, 'x');
}

class HostileConnectionsTest : public LaunchedJobsTest {};

TEST_F(HostileConnectionsTest, IdleAndSlowConnectionsLeaveTheJobAsUndisturbed) {
  const std::string base = NewJob("soak-base"), job = NewJob("soak");
  auto b = StartLaunch(TRELLIS_BIN_DIR, dir_, base, JobYaml(base, dir_ + "/ckpt-" + base));
  auto p = StartLaunch(TRELLIS_BIN_DIR, dir_, job, JobYaml(job, dir_ + "/ckpt-" + job));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(p.ok()) << p.status().ToString();

  // The server's ports: the data port from its "serving on host:port;tcp=P" line, /metrics
  // from the environment its agent gave it.
  pid_t server = -1;
  int data_port = 0, metrics_port = 0;
  const std::string server_log = dir_ + "/logs-" + job + "/server-0.log";
  for (auto until = std::chrono::steady_clock::now() + 60s;
       (data_port == 0 || metrics_port == 0) && std::chrono::steady_clock::now() < until &&
       !(*p)->Poll();
       std::this_thread::sleep_for(50ms)) {
    server = ProgramOf(job, "server", 0);
    std::smatch m;
    const std::string log = ReadFile(server_log);
    if (std::regex_search(log, m, std::regex("serving on [^ ]*;tcp=([0-9]+)"))) {
      data_port = std::stoi(m[1]);
    }
    const std::string env = ReadFile("/proc/" + std::to_string(server) + "/environ");
    if (server > 0 && std::regex_search(env, m, std::regex("TRELLIS_METRICS_PORT=([0-9]+)"))) {
      metrics_port = std::stoi(m[1]);
    }
  }
  ASSERT_GT(data_port, 0) << ReadFile(server_log);
  ASSERT_GT(metrics_port, 0);
  const int threads_before = Threads(server);

  int max_threads = threads_before;
  bool scraped = false;
  std::chrono::steady_clock::duration flooded{};
  bool ended_before_flood = true;
  int64_t data_closed = 0;
  {
    Flood flood({{data_port, 200, 100, SlowHello()},
                 {metrics_port, 50, 50, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"}});
    const auto start = std::chrono::steady_clock::now();
    while (flood.opened() < static_cast<int64_t>(flood.size()) &&
           std::chrono::steady_clock::now() < start + 20s) {
      std::this_thread::sleep_for(20ms);
    }
    ended_before_flood = (*p)->Poll().has_value();
    for (auto until = std::chrono::steady_clock::now() + 100s;
         !(*p)->Poll() && std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(200ms)) {
      max_threads = std::max(max_threads, Threads(server));
      if (!scraped) scraped = Scrape(metrics_port, 5000).find("trellis_pserver_") != std::string::npos;
    }
    flooded = std::chrono::steady_clock::now() - start;
    data_closed = flood.closed(0);
  }
  std::cout << "flood of " << 400 << " connections for "
            << std::chrono::duration_cast<std::chrono::milliseconds>(flooded).count()
            << " ms: server threads " << threads_before << " before, at most " << max_threads
            << " during; " << data_closed << " data connections closed by the server\n";
  auto st = (*p)->WaitFor(30s);
  auto bst = (*b)->WaitFor(100s);
  const std::string out = ReadFile(dir_ + "/" + job + ".out");
  const std::string base_out = ReadFile(dir_ + "/" + base + ".out");
  ASSERT_TRUE(bst.has_value() && bst->exit_code == 0) << base_out;
  ASSERT_TRUE(st.has_value()) << "the flooded job did not end\n" << out;
  ASSERT_EQ(st->exit_code, 0) << out;
  ASSERT_FALSE(ended_before_flood) << "the job ended before the flood was in place: a test "
                                      "that proves nothing\n" << out;

  // What the flood cost the server: no thread per connection (there were 400), and the data
  // port's ones were closed at the hello deadline once it had passed.
  EXPECT_LT(max_threads - threads_before, 32)
      << threads_before << " threads before the flood, up to " << max_threads << " during it";
  EXPECT_TRUE(scraped) << "/metrics answered no scrape during the flood";
  if (flooded > 12s) {
    EXPECT_GT(data_closed, 0) << "no data connection closed at the hello deadline in "
                              << std::chrono::duration_cast<std::chrono::seconds>(flooded).count()
                              << " s";
    EXPECT_NE(ReadFile(server_log).find("no whole hello within 10000 ms"), std::string::npos);
  }

  // The job's result: as undisturbed.
  const double whole = MlpAccuracy(base_out), got = MlpAccuracy(out);
  ASSERT_GT(whole, 0) << base_out;
  EXPECT_EQ(got, whole) << out;
  ExpectSameFinalModel(dir_ + "/ckpt-" + base, dir_ + "/ckpt-" + job, kSteps,
                       "a flood of unauthenticated connections");
}

}  // namespace
}  // namespace trellis
