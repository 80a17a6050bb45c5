#include <gtest/gtest.h>

#include <set>

#include "common/config/env.h"
#include "common/base/net.h"

namespace trellis {
namespace {

TEST(ParseHostPortTest, AcceptsHostsAndBracketedV6) {
  auto a = ParseHostPort("127.0.0.1:5000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 5000);
  auto b = ParseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->ToString(), "[::1]:80");
  EXPECT_EQ(ParseHostPort("sched.ns.svc:7000")->ToString(), "sched.ns.svc:7000");
}

TEST(ParseHostPortTest, RejectsWithTheReason) {
  struct Case { const char* in; const char* why; };
  for (auto c : {Case{"localhost", "expected host:port"}, Case{":80", "empty host"},
                 Case{"h:", "port is not a number"}, Case{"h:8x", "port is not a number"},
                 Case{"h:0", "port must be in 1..65535"}, Case{"h:70000", "port must be in 1..65535"},
                 Case{"::1:80", "IPv6 addresses need brackets"}, Case{"[::1", "missing ']'"}}) {
    auto r = ParseHostPort(c.in);
    ASSERT_FALSE(r.ok()) << c.in;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(std::string("'") + c.in + "'"), std::string::npos);
  }
}

TEST(PickFreePortTest, ReturnsABindablePort) {
  auto p = PickFreePort();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_GT(*p, 0);
  EXPECT_LE(*p, 65535);
  EXPECT_FALSE(PickFreePort("not-an-ip").ok());
}

// The launcher picks every /metrics port of a job at once: they must all differ. Picked one
// after another (bind to 0, close, again), 500 ports repeat one almost surely; held together
// they cannot. (A job's agent and program were given the same port and one of them ran without
// /metrics.)
TEST(PickFreePortTest, PortsPickedTogetherAreDistinct) {
  auto ports = PickFreePorts("127.0.0.1", 500);
  ASSERT_TRUE(ports.ok()) << ports.status().ToString();
  ASSERT_EQ(ports->size(), 500u);
  std::set<int> distinct(ports->begin(), ports->end());
  EXPECT_EQ(distinct.size(), 500u);
  for (int p : *ports) EXPECT_GT(p, 0);
  EXPECT_FALSE(PickFreePorts("not-an-ip", 2).ok());
  EXPECT_TRUE(PickFreePorts("127.0.0.1", 0)->empty());
}

TEST(EnvSourceTest, RequiredOptionalAndRanges) {
  EnvSource env({{"A", "12"}, {"EMPTY", ""}, {"BAD", "1e3"}});
  EXPECT_EQ(*env.RequiredInt("A", 0, 100), 12);
  EXPECT_NE(env.RequiredInt("A", 0, 10).status().message().find("A: must be in 0..10, got 12"), std::string::npos);
  EXPECT_NE(env.Required("EMPTY").status().message().find("EMPTY is empty"), std::string::npos);
  EXPECT_NE(env.Required("NOPE").status().message().find("NOPE is not set"), std::string::npos);
  EXPECT_FALSE(env.OptionalInt("NOPE", 0, 1)->has_value());
  EXPECT_FALSE(env.OptionalInt("EMPTY", 0, 1)->has_value());
  EXPECT_NE(env.OptionalInt("BAD", 0, 10000).status().message().find("not an integer, got '1e3'"),
            std::string::npos);
  EXPECT_EQ(env.GetOr("EMPTY", "dflt"), "dflt");
}

TEST(CurrentEnvironmentTest, SeesTheProcessEnvironment) {
  setenv("TRELLIS_TEST_MARKER", "x=y", 1);
  auto env = CurrentEnvironment();
  EXPECT_EQ(env["TRELLIS_TEST_MARKER"], "x=y");  // only the first '=' splits
}

}  // namespace
}  // namespace trellis
