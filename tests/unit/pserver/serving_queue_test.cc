// Where the serving queue runs a request: on the submitting thread when nothing waits and the
// request is small, or of any size when its transport said nothing more waits behind it
// (ServingQueue::Inline::kAnySize); otherwise on a pool thread, highest priority first.
#include "pserver/serving_queue.h"

#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "tests/unit/pserver/serving_queue_peer.h"

namespace trellis {
namespace {

constexpr size_t kBig = 4 << 20;

// The thread that ran a job submitted with `policy` for a payload of `bytes`.
std::thread::id RunsOn(ServingQueue& q, size_t bytes, ServingQueue::Inline policy) {
  std::promise<std::thread::id> ran;
  EXPECT_TRUE(q.Submit(0, bytes, [&] { ran.set_value(std::this_thread::get_id()); }, policy));
  return ran.get_future().get();
}

TEST(ServingQueueTest, SmallRequestsAndIdleLinksAreServedOnTheCallersThread) {
  ServingQueue q(ServingQueueOptions{1, 64 << 10});
  const auto me = std::this_thread::get_id();
  EXPECT_EQ(RunsOn(q, 4096, ServingQueue::Inline::kSmallOnly), me);
  EXPECT_NE(RunsOn(q, kBig, ServingQueue::Inline::kSmallOnly), me) << "a big request by default "
                                                                      "goes to the pool";
  EXPECT_EQ(RunsOn(q, kBig, ServingQueue::Inline::kAnySize), me)
      << "nothing waits behind it: the transport's thread serves it";
}

TEST(ServingQueueTest, NothingRunsInlineWhileOthersWait) {
  ServingQueue q(ServingQueueOptions{1, 64 << 10});
  ServingQueueTestPeer peer(&q);
  peer.Hold();
  std::promise<void> first;
  ASSERT_TRUE(q.Submit(0, 16, [&] { first.set_value(); }));
  ASSERT_EQ(peer.Queued(), 1u);
  // Something waits: even a small request, or one whose link is idle, must not overtake it.
  std::promise<std::thread::id> ran;
  ASSERT_TRUE(q.Submit(5, 16, [&] { ran.set_value(std::this_thread::get_id()); },
                       ServingQueue::Inline::kAnySize));
  EXPECT_EQ(peer.Queued(), 2u);
  peer.Release();
  EXPECT_NE(ran.get_future().get(), std::this_thread::get_id());
  first.get_future().get();
}

}  // namespace
}  // namespace trellis
