// MetricsRegistry (constant labels, same series twice, errors as a path, not an exception) and
// MetricsHttpServer (/metrics, /healthz, port 0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "tests/testing/http_get.h"

namespace trellis {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsRegistryTest, EverySeriesCarriesTheConstantLabels) {
  MetricsRegistry m({"mnist", "worker", 3});
  m.Counter("trellis_worker_steps_total", "Steps").Increment(2);
  m.Gauge("trellis_worker_queue_depth", "Queued", {{"priority", "high"}}).Set(5);
  const std::string text = m.Serialize();
  EXPECT_THAT(text, HasSubstr("trellis_worker_steps_total{job=\"mnist\",rank=\"3\",role=\"worker\"} 2"));
  // Constant labels first, then the series' own.
  EXPECT_THAT(text, HasSubstr("trellis_worker_queue_depth{job=\"mnist\",rank=\"3\",role=\"worker\",priority=\"high\"} 5"));
  EXPECT_THAT(text, HasSubstr("# TYPE trellis_worker_steps_total counter"));
  EXPECT_THAT(text, HasSubstr("# HELP trellis_worker_steps_total Steps"));
  EXPECT_TRUE(m.errors().empty());
}

TEST(MetricsRegistryTest, EmptyJobAndNegativeRankLeaveTheLabelOut) {
  MetricsRegistry m({"", "operator", -1});
  m.Counter("trellis_operator_x_total", "x").Increment();
  EXPECT_THAT(m.Serialize(), HasSubstr("trellis_operator_x_total{role=\"operator\"} 1"));
}

TEST(MetricsRegistryTest, SameNameAndLabelsReturnTheSameSeries) {
  MetricsRegistry m({"j", "server", 0});
  auto& a = m.Counter("trellis_server_bytes_total", "b", {{"dir", "in"}});
  auto& b = m.Counter("trellis_server_bytes_total", "b", {{"dir", "in"}});
  auto& c = m.Counter("trellis_server_bytes_total", "b", {{"dir", "out"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  auto& h1 = m.Histogram("trellis_server_update_seconds", "u", MetricsRegistry::LatencyBuckets());
  auto& h2 = m.Histogram("trellis_server_update_seconds", "u", MetricsRegistry::LatencyBuckets());
  EXPECT_EQ(&h1, &h2);
  // One HELP/TYPE block per family.
  const std::string text = m.Serialize();
  EXPECT_EQ(text.find("# TYPE trellis_server_bytes_total"), text.rfind("# TYPE trellis_server_bytes_total"));
}

TEST(MetricsRegistryTest, InvalidNamesAndClashesAreErrorsNotExceptions) {
  MetricsRegistry m({"j", "worker", 0});
  auto& bad = m.Counter("bad name!", "x");
  bad.Increment();  // a detached series still works
  EXPECT_EQ(bad.Value(), 1);
  m.Gauge("trellis_worker_thing", "g").Set(1);
  auto& clash = m.Counter("trellis_worker_thing", "c");  // gauge already
  clash.Increment();
  auto& bad_label = m.Gauge("trellis_worker_other", "g", {{"0bad", "v"}});
  bad_label.Set(3);
  auto& reserved = m.Gauge("trellis_worker_other", "g", {{"rank", "7"}});  // a constant label
  reserved.Set(4);
  m.Counter("trellis_metrics_registration_errors_total", "mine").Increment(100);  // the registry's own
  EXPECT_EQ(m.errors().size(), 5u) << ::testing::PrintToString(m.errors());
  const std::string text = m.Serialize();
  EXPECT_THAT(text, HasSubstr("trellis_metrics_registration_errors_total{job=\"j\",rank=\"0\",role=\"worker\"} 5"));
  EXPECT_THAT(text, Not(HasSubstr("bad name")));
  EXPECT_THAT(text, Not(HasSubstr("trellis_worker_thing_total")));
  EXPECT_THAT(text, HasSubstr("# TYPE trellis_worker_thing gauge"));
}

TEST(MetricsRegistryTest, LatencyBucketsSpanMicrosecondsToSeconds) {
  const auto b = MetricsRegistry::LatencyBuckets();
  ASSERT_GE(b.size(), 20u);
  EXPECT_DOUBLE_EQ(b.front(), 1e-6);
  EXPECT_DOUBLE_EQ(b.back(), 10.0);
  for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
}

TEST(MetricsRegistryTest, CollectHooksRunBeforeEachSerialize) {
  MetricsRegistry m({"j", "scheduler", -1});
  auto& g = m.Gauge("trellis_scheduler_nodes", "n");
  int calls = 0;
  m.OnCollect([&] { g.Set(++calls); });
  EXPECT_THAT(m.Serialize(), HasSubstr("trellis_scheduler_nodes{job=\"j\",role=\"scheduler\"} 1"));
  EXPECT_THAT(m.Serialize(), HasSubstr("trellis_scheduler_nodes{job=\"j\",role=\"scheduler\"} 2"));
}

TEST(MetricsHttpServerTest, ServesMetricsAndHealthOnAPickedPort) {
  MetricsRegistry m({"j", "server", 1});
  m.Counter("trellis_server_requests_total", "r").Increment(7);
  std::atomic<bool> healthy{true};
  auto s = MetricsHttpServer::Start("127.0.0.1", 0, m, [&] { return healthy.load(); });
  ASSERT_TRUE(s.ok()) << s.status().message();
  const int port = (*s)->port();
  ASSERT_GT(port, 0);

  auto r = testing::HttpGet(port, "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.headers, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(r.body, HasSubstr("trellis_server_requests_total{job=\"j\",rank=\"1\",role=\"server\"} 7"));

  EXPECT_EQ(testing::HttpGet(port, "/healthz").status, 200);
  healthy = false;
  EXPECT_EQ(testing::HttpGet(port, "/healthz").status, 503);
  EXPECT_EQ(testing::HttpGet(port, "/nope").status, 404);

  // Stopping frees the port: nothing answers any more.
  s->reset();
  EXPECT_EQ(testing::HttpGet(port, "/metrics").status, 0);
}

// A process adds its own paths (the operator's /sd/targets); each gets the request's Host, only
// when it is a plain host[:port] (it is echoed into JSON).
TEST(MetricsHttpServerTest, AddedRoutesAnswerWithTheRequestsHost) {
  MetricsRegistry m({"", "operator", -1});
  std::vector<HttpRoute> routes = {
      {"/sd/targets", "application/json", [](const std::string& host) { return "[\"" + host + "\"]"; }}};
  auto s = MetricsHttpServer::Start("127.0.0.1", 0, m, {}, routes);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto r = testing::HttpGet((*s)->port(), "/sd/targets?x=1");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "[\"127.0.0.1\"]");
  EXPECT_THAT(r.headers, HasSubstr("application/json"));
  EXPECT_EQ(testing::HttpGet((*s)->port(), "/metrics").status, 200);
  EXPECT_EQ(testing::HttpGet((*s)->port(), "/sd/other").status, 404);
}

TEST(MetricsHttpServerTest, APortInUseIsAnError) {
  MetricsRegistry m({"j", "server", 0});
  auto a = MetricsHttpServer::Start("127.0.0.1", 0, m);
  ASSERT_TRUE(a.ok()) << a.status().message();
  auto b = MetricsHttpServer::Start("127.0.0.1", (*a)->port(), m);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("cannot serve /metrics on 127.0.0.1:"));
  EXPECT_FALSE(MetricsHttpServer::Start("127.0.0.1", 70000, m).ok());
}

// One slow client used to hold the server for up to 5 s, and ten of them held a scrape for
// tens of seconds: the clients were answered one after another. Now a scrape is answered while
// ten others dribble one byte a second or say nothing at all.
TEST(MetricsHttpServerTest, SlowClientsDoNotHoldUpAScrape) {
  MetricsRegistry m({"j", "server", 0});
  m.Counter("trellis_server_requests_total", "r").Increment(3);
  auto s = MetricsHttpServer::Start("127.0.0.1", 0, m);
  ASSERT_TRUE(s.ok()) << s.status().message();
  const int port = (*s)->port();
  std::vector<int> slow;
  for (int i = 0; i < 10; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    slow.push_back(fd);
  }
  std::atomic<bool> stop{false};
  std::thread dribble([&] {  // half of them send "GET /metrics..." one byte a second
    const std::string req = "GET /metrics HTTP/1.1\r\n\r\n";
    for (size_t b = 0; b < req.size() && !stop; ++b) {
      for (size_t i = 0; i < slow.size(); i += 2) (void)::send(slow[i], &req[b], 1, MSG_NOSIGNAL);
      for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the slow ones are in first
  const auto start = std::chrono::steady_clock::now();
  auto r = testing::HttpGet(port, "/metrics", std::chrono::seconds(30));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 200);
  EXPECT_THAT(r.body, HasSubstr("trellis_server_requests_total"));
  EXPECT_LT(secs, 2.0) << "a scrape waited behind slow clients";
  EXPECT_EQ(testing::HttpGet(port, "/healthz", std::chrono::seconds(30)).status, 200);
  stop = true;
  dribble.join();
  for (int fd : slow) ::close(fd);
}

}  // namespace
}  // namespace trellis
