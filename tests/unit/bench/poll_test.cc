// PollUntil: the bench's start-up wait. A late answer on a loaded machine must not end it
// (bench_pushpull failed 4 of 108 start-ups on one DEADLINE_EXCEEDED GetCluster).
#include "bench/common/poll.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

namespace trellis::bench {
namespace {

using namespace std::chrono_literals;

TEST(BenchPollUntil, LateAndRefusedPollsAreRetried) {
  std::vector<StatusOr<bool>> answers = {DeadlineExceededError("scheduler 127.0.0.1:1: GetCluster"),
                                         UnavailableError("connection refused"), false, true};
  size_t calls = 0;
  Status st = PollUntil([&]() -> StatusOr<bool> { return answers.at(calls++); }, 30s, "ready");
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(calls, 4u);
}

TEST(BenchPollUntil, OtherErrorsEndTheWaitAtOnce) {
  size_t calls = 0;
  Status st = PollUntil(
      [&]() -> StatusOr<bool> {
        ++calls;
        return AbortedError("trellis-pserver 0 exited with code 1");
      },
      30s, "ready");
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_EQ(calls, 1u);
}

TEST(BenchPollUntil, BoundedByTheTotalAndNamesTheLastError) {
  const auto start = std::chrono::steady_clock::now();
  Status st = PollUntil([]() -> StatusOr<bool> { return DeadlineExceededError("late GetCluster"); },
                        200ms, "the servers did not report ready");
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.message().find("the servers did not report ready"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("late GetCluster"), std::string::npos) << st.message();
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, 10s);  // generous: a loaded machine
}

}  // namespace
}  // namespace trellis::bench
