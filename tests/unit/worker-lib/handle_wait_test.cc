// Handle::Wait: a small operation polls for its answer for a few microseconds before it blocks
// (op_state.h). Whichever way it waits, Wait returns the operation's status only after the
// completion callback ran, and counts the time it waited for ReportProgress's busy time.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "worker-lib/src/op_state.h"

namespace trellis {
namespace {

using namespace std::chrono_literals;

struct Op {
  std::shared_ptr<Handle::State> state = std::make_shared<Handle::State>();
  std::shared_ptr<std::atomic<int64_t>> wait_ns = std::make_shared<std::atomic<int64_t>>(0);
  int callback_saw = 0;  // written by the callback, read after Wait: Wait orders them

  explicit Op(bool spin) {
    state->spin_before_blocking = spin;
    state->wait_ns = wait_ns;
    state->SetCallback([this](const Status& st) { callback_saw = st.ok() ? 1 : 2; });
  }
};

class HandleWait : public ::testing::TestWithParam<bool> {};

TEST_P(HandleWait, AnAnswerWithinTheSpinIsSeenWithItsCallbackDone) {
  for (int i = 0; i < 200; ++i) {
    Op op(GetParam());
    std::thread answer([&] { op.state->Complete(Status::Ok()); });
    Handle h(op.state);
    ASSERT_TRUE(h.Wait().ok());
    EXPECT_EQ(op.callback_saw, 1) << "Wait returned before the callback ran (round " << i << ")";
    answer.join();
  }
}

TEST_P(HandleWait, AnAnswerLongAfterTheSpinStillWakesTheWaiter) {
  Op op(GetParam());
  std::atomic<bool> waiting{false};
  std::thread answer([&] {
    while (!waiting.load()) std::this_thread::yield();
    std::this_thread::sleep_for(30ms);  // far past Handle::State::kWaitSpin
    op.state->Complete(UnavailableError("server gone"));
  });
  const auto before = std::chrono::steady_clock::now();
  waiting.store(true);
  const Status st = Handle(op.state).Wait();
  const auto after = std::chrono::steady_clock::now();
  answer.join();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_EQ(op.callback_saw, 2);
  // The blocked time counts as waiting, not only the spin (50 us): most of the 30 ms sleep is in
  // wait_ns. Not all of it can be asserted: Wait's clock starts a moment after the answer thread
  // may begin its sleep (a loaded machine can preempt the waiter there), so the bound is half.
  EXPECT_GE(*op.wait_ns, std::chrono::nanoseconds(15ms).count());
  // ...and no more than the call took.
  EXPECT_LE(*op.wait_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(after - before).count());
}

TEST_P(HandleWait, ADoneOperationReturnsAtOnceAndCountsNoWait) {
  Op op(GetParam());
  op.state->Complete(Status::Ok());
  EXPECT_TRUE(Handle(op.state).Wait().ok());
  EXPECT_TRUE(Handle(op.state).Wait().ok());  // again: the same outcome
  EXPECT_EQ(*op.wait_ns, 0);
}

INSTANTIATE_TEST_SUITE_P(SpinOrBlock, HandleWait, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Spins" : "Blocks"; });

}  // namespace
}  // namespace trellis
