// Two operator replicas and one Lease, against the API double with a fake clock.
#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <iterator>
#include <thread>

#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "operator/leader_election.h"
#include "tests/integration/operator/double_fixture.h"

namespace trellis::op::testing {
namespace {

using std::chrono::seconds;

class LeaderTest : public DoubleTest {
 protected:
  LeaseOptions Options(const std::string& id) {
    LeaseOptions o;
    o.identity = id;
    o.duration = seconds(15);
    return o;
  }
  bool Try(LeaderElector& e) {
    auto r = e.TryAcquireOrRenew();
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() && *r;
  }
  Clock::time_point now_ = Clock::from_time_t(1'800'000'000);
};

TEST_F(LeaderTest, OneHolderRenewsTheOtherTakesOverOnlyAfterExpiry) {
  LeaderElector a(*client_, Options("a"), [this] { return now_; });
  LeaderElector b(*client_, Options("b"), [this] { return now_; });
  EXPECT_TRUE(Try(a));   // creates the Lease
  EXPECT_FALSE(Try(b));  // held
  now_ += seconds(10);
  EXPECT_TRUE(Try(a));   // renewed
  now_ += seconds(10);
  EXPECT_FALSE(Try(b));  // 10 s after the renewal: still a's
  now_ += seconds(10);
  EXPECT_TRUE(Try(b));   // 20 s without a renewal: expired, b takes it
  EXPECT_FALSE(Try(a));  // a learns it lost
  auto lease = client_->Get(kLeases, "default", "trellis-operator");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(Str(*lease, {"spec", "holderIdentity"}), "b");
  EXPECT_EQ(Int(*lease, {"spec", "leaseTransitions"}), 1);
  EXPECT_EQ(Str(*lease, {"spec", "renewTime"}), FormatMicroTime(now_));
}

TEST_F(LeaderTest, ReleasedLeaseIsTakenAtOnce) {
  LeaderElector a(*client_, Options("a"), [this] { return now_; });
  LeaderElector b(*client_, Options("b"), [this] { return now_; });
  EXPECT_TRUE(Try(a));
  EXPECT_FALSE(Try(b));
  ASSERT_TRUE(b.Release().ok());  // not b's: left alone
  EXPECT_FALSE(Try(b));
  ASSERT_TRUE(a.Release().ok());
  auto lease = client_->Get(kLeases, "default", "trellis-operator");
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(Str(*lease, {"spec", "holderIdentity"}), "");
  EXPECT_EQ(Int(*lease, {"spec", "leaseDurationSeconds"}), 1);
  EXPECT_TRUE(Try(b));  // the same instant: no waiting out the 15 s
  EXPECT_FALSE(Try(a));
}

// Two trellis-operator processes: SIGTERM to the leader hands the Lease to the standby well
// before the lease duration (15 s) has passed.
TEST_F(LeaderTest, StandbyTakesOverAtOnceWhenTheLeaderStopsOnSigterm) {
  auto start = [&](const std::string& name) {
    SpawnOptions o;
    o.argv = {std::string(TRELLIS_BIN_DIR) + "/trellis-operator", "--server", server_, "--metrics-port", "0",
              "--leader-elect", "true"};
    o.env = CurrentEnvironment();
    o.stdout_mode = SpawnOptions::Output::kFile;
    o.stdout_path = dir_ + "/" + name + ".log";
    o.stderr_mode = SpawnOptions::Output::kStdout;
    auto p = Subprocess::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().message();
    return p.ok() ? std::move(*p) : nullptr;
  };
  auto holder = [&] {
    auto lease = client_->Get(kLeases, "default", "trellis-operator");
    return lease.ok() ? Str(*lease, {"spec", "holderIdentity"}) : std::string();
  };
  auto first = start("first");
  ASSERT_TRUE(first);
  ASSERT_TRUE(WaitFor([&] { return !holder().empty(); }, seconds(20)));
  const std::string leader = holder();
  auto second = start("second");
  ASSERT_TRUE(second);
  // The standby has tried (and failed) to take the lease: its log says it waits.
  ASSERT_TRUE(WaitFor(
      [&] {
        std::ifstream in(dir_ + "/second.log");
        std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        return text.find("waiting for the Lease") != std::string::npos;
      },
      seconds(20)));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(holder(), leader);

  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(first->Signal(SIGTERM).ok());
  ASSERT_TRUE(WaitFor([&] { return !holder().empty() && holder() != leader; }, seconds(30)));
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "standby took over " << took << " s after SIGTERM to the leader (lease duration 15 s)\n";
  EXPECT_LT(took, 8.0);
  auto exit = first->WaitFor(seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  ASSERT_TRUE(second->Signal(SIGTERM).ok());
  EXPECT_TRUE(second->WaitFor(seconds(10)).has_value());
}

TEST(LeaseTest, CanHoldLeaseAndMicroTime) {
  const auto t = Clock::from_time_t(1'800'000'000);
  EXPECT_EQ(FormatMicroTime(t + std::chrono::microseconds(42)), "2027-01-15T08:00:00.000042Z");
  Json held = *ParseJson(R"({"spec":{"holderIdentity":"x","leaseDurationSeconds":15,
                                     "renewTime":"2027-01-15T08:00:00.000000Z"}})");
  EXPECT_FALSE(CanHoldLease(held, "y", t + seconds(10)));
  EXPECT_TRUE(CanHoldLease(held, "x", t + seconds(10)));
  EXPECT_TRUE(CanHoldLease(held, "y", t + seconds(16)));
  EXPECT_TRUE(CanHoldLease(*ParseJson(R"({"spec":{}})"), "y", t));
}

}  // namespace
}  // namespace trellis::op::testing
