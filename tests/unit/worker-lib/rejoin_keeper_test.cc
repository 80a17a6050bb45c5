// RejoinKeeper's live mode (what trellis.torch uses; worker-lib/src/rejoin_keeper.h): nothing is
// copied at a commit, so a serve must wait while the donor's update window is open (its tensors
// are half updated) and the donor's next update must wait while a serve reads them. In-process
// servers and scheduler, as worker_rejoin_test (which covers the copy mode through Checkpointer).
#include "worker-lib/src/rejoin_keeper.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/worker-lib/local_cluster.h"
#include "tests/unit/worker-lib/rejoin_scheduler.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kN = 6;  // the tracked tensor, on key 1
constexpr int64_t kS = 4;  // the state buffer, on key 2
constexpr KeyId kStateKey = 2;
// How long a wait that must not end is watched (a wrong keeper ends it within milliseconds).
constexpr auto kHeld = 300ms;

class LiveKeeperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(rejoins_.Start("lk", 2).ok());
    testing::ClusterOptions o;
    o.servers = 2;
    o.workers = 2;
    o.slice_bytes = 8;
    o.timeout_ms = 10000;
    o.transport = "tcp";
    o.customize = [this](int rank, WorkerSetup* s) { rejoins_.Hook(rank, s); };
    ASSERT_TRUE(cluster_.Start(o).ok());
    for (auto& w : cluster_.workers) Declare(*w);
  }
  void TearDown() override { donor_.reset(); }

  static void Declare(Worker& w) {
    ASSERT_TRUE(w.DeclareKey({.id = 1, .name = "w", .num_elements = kN}).ok());
    ASSERT_TRUE(w.DeclareKey({.id = kStateKey, .name = "state", .num_elements = kS}).ok());
    ASSERT_TRUE(w.FinishDeclarations().ok());
  }
  // Worker 1 dies and its replacement (incarnation 2) asks to rejoin, on a thread.
  std::future<StatusOr<std::optional<int64_t>>> RestartWorkerOne() {
    cluster_.workers[1].reset();
    EXPECT_EQ(rejoins_.Register(1), 2);
    auto made = CreateWorker(cluster_.SetupFor(1));
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    cluster_.workers[1] = std::move(*made);
    Declare(*cluster_.workers[1]);
    auto* impl = dynamic_cast<WorkerImpl*>(cluster_.workers[1].get());
    rejoiner_ = std::make_unique<RejoinKeeper>(
        *impl, std::vector<TensorRef>{{.name = "w", .data = w1_.data(), .num_elements = kN, .key = 1}},
        kStateKey, s1_.data(), kS);
    return std::async(std::launch::async, [this] { return rejoiner_->Rejoin(); });
  }

  testing::RejoinScheduler rejoins_;
  testing::LocalCluster cluster_;
  std::vector<float> w0_ = std::vector<float>(kN), s0_ = std::vector<float>(kS);
  std::vector<float> w1_ = std::vector<float>(kN), s1_ = std::vector<float>(kS);
  std::unique_ptr<RejoinKeeper> rejoiner_;  // before the donor: destroyed after it
  std::unique_ptr<RejoinKeeper> donor_;
};

TEST_F(LiveKeeperTest, ServeWaitsForTheOpenUpdateAndTheNextUpdateWaitsForTheServe) {
  // The donor's prepare fills the state with its step; the first call parks until released.
  std::promise<int64_t> in_prepare;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> prepares{0};
  auto* impl = dynamic_cast<WorkerImpl*>(cluster_.workers[0].get());
  donor_ = std::make_unique<RejoinKeeper>(
      *impl, std::vector<TensorRef>{{.name = "w", .data = w0_.data(), .num_elements = kN, .key = 1}},
      kStateKey, s0_.data(), kS, [&](int64_t step) {
        for (auto& x : s0_) x = static_cast<float>(step);
        if (prepares++ == 0) {
          in_prepare.set_value(step);
          released.wait();
        }
        return Status::Ok();
      });
  std::fill(w0_.begin(), w0_.end(), 1.0f);
  ASSERT_TRUE(donor_->Commit(1).ok());
  // Step 2's update is under way: half the tensor is new when the rejoin arrives.
  donor_->BeginUpdate();
  std::fill(w0_.begin(), w0_.begin() + kN / 2, 2.0f);
  auto rejoined = RestartWorkerOne();
  auto prepared = in_prepare.get_future();
  EXPECT_EQ(prepared.wait_for(kHeld), std::future_status::timeout)
      << "a serve read the tensors inside the update window";
  std::fill(w0_.begin() + kN / 2, w0_.end(), 2.0f);
  ASSERT_TRUE(donor_->Commit(2).ok());
  ASSERT_EQ(prepared.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(prepared.get(), 2);  // the commit that closed the window
  // The serve reads the tensors now: step 3's update may not begin.
  auto update = std::async(std::launch::async, [&] { donor_->BeginUpdate(); });
  EXPECT_EQ(update.wait_for(kHeld), std::future_status::timeout)
      << "an update began while a serve read the tensors";
  release.set_value();
  ASSERT_EQ(update.wait_for(10s), std::future_status::ready);
  std::fill(w0_.begin(), w0_.end(), 3.0f);  // step 3's update, after the serve
  ASSERT_EQ(rejoined.wait_for(10s), std::future_status::ready);
  auto r = rejoined.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->has_value());
  EXPECT_EQ(**r, 2);
  EXPECT_EQ(w1_, std::vector<float>(kN, 2.0f));  // step 2's values, none of step 3's
  EXPECT_EQ(s1_, std::vector<float>(kS, 2.0f));  // what prepare packed for step 2
  ASSERT_TRUE(donor_->Commit(3).ok());
}

TEST_F(LiveKeeperTest, ACopiedCommitIsServedWhileTheTensorsChangeOutsideAWindow) {
  // keep_copy's case (step(closure), join()): the tensors change while the donor waits for the
  // others, where no window can be open; the copy of the last commit is what a serve hands out.
  std::atomic<int> prepares{0};
  auto* impl = dynamic_cast<WorkerImpl*>(cluster_.workers[0].get());
  donor_ = std::make_unique<RejoinKeeper>(
      *impl, std::vector<TensorRef>{{.name = "w", .data = w0_.data(), .num_elements = kN, .key = 1}},
      kStateKey, s0_.data(), kS, [&](int64_t) {
        ++prepares;
        return Status::Ok();
      });
  std::fill(w0_.begin(), w0_.end(), 1.0f);
  std::fill(s0_.begin(), s0_.end(), 5.0f);  // the caller packed the state before the copy
  ASSERT_TRUE(donor_->Commit(1).ok());
  donor_->BeginUpdate();
  ASSERT_TRUE(donor_->Commit(1, /*again=*/true, /*copy=*/true).ok());
  std::fill(w0_.begin(), w0_.end(), 9.0f);  // changed outside a window
  std::fill(s0_.begin(), s0_.end(), 9.0f);
  auto rejoined = RestartWorkerOne();
  ASSERT_EQ(rejoined.wait_for(10s), std::future_status::ready);
  auto r = rejoined.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(**r, 1);
  EXPECT_EQ(w1_, std::vector<float>(kN, 1.0f));
  EXPECT_EQ(s1_, std::vector<float>(kS, 5.0f));
  EXPECT_EQ(prepares.load(), 0);  // the copy needs no prepare
}

}  // namespace
}  // namespace trellis
