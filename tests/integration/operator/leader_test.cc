// Two operator replicas and one Lease, against the API double with a fake clock.
#include <gtest/gtest.h>

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
