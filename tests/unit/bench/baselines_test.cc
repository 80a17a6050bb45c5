// Smoke runs of the baseline measurements: they move real bytes on loopback and report
// plausible figures (tiny budgets, so the whole file runs in well under a second).
#include <gtest/gtest.h>

#include "bench/pushpull/grpc_echo.h"
#include "bench/pushpull/tcp_echo.h"

namespace trellis::bench {
namespace {

constexpr Budget kTiny{.warmup_iters = 1, .min_iters = 3, .max_iters = 3, .max_seconds = 0};

TEST(BenchTcpEcho, EchoesWholeMessages) {
  for (uint64_t size : {uint64_t{4096}, uint64_t{3} << 20}) {
    StatusOr<TcpEchoResult> r = MeasureTcpEcho(size, kTiny);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->messages, 3);
    EXPECT_GT(r->gbytes_per_s, 0);
    EXPECT_GT(r->p50_s, 0);
    EXPECT_GE(r->p99_s, r->p50_s);
    EXPECT_GT(r->socket_buffer_bytes, 0);
  }
}

TEST(BenchGrpcEcho, UnaryAndStreamRoundTrip) {
  StatusOr<std::unique_ptr<GrpcEchoServer>> server = GrpcEchoServer::Start();
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  StatusOr<LatencyResult> unary = MeasureGrpcUnary((*server)->address(), 4096, kTiny);
  ASSERT_TRUE(unary.ok()) << unary.status().ToString();
  EXPECT_EQ(unary->calls, 3);
  EXPECT_GT(unary->p50_s, 0);
  // Above gRPC's default 4 MiB receive limit: the bench must lift it on both sides.
  StatusOr<StreamResult> stream = MeasureGrpcStream((*server)->address(), 5u << 20, kTiny);
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  EXPECT_EQ(stream->messages, 3);
  EXPECT_GT(stream->gbytes_per_s, 0);
}

TEST(BenchGrpcEcho, UnreachableServerIsAnErrorNotAHang) {
  // A loopback port nobody listens on any more: the measurement comes back at once with an
  // error value (no wait-for-ready, so no wait until the deadline).
  StatusOr<std::unique_ptr<GrpcEchoServer>> server = GrpcEchoServer::Start();
  ASSERT_TRUE(server.ok());
  const std::string address = (*server)->address();
  server->reset();  // now nothing listens there
  StatusOr<LatencyResult> unary = MeasureGrpcUnary(address, 4096, kTiny);
  EXPECT_FALSE(unary.ok());
}

}  // namespace
}  // namespace trellis::bench
