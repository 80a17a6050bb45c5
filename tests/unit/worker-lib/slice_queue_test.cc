#include "worker-lib/src/slice_queue.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace trellis {
namespace {

TEST(SliceQueueTest, HighestPriorityFirstFifoWithin) {
  SliceQueue<int> q(100);
  q.Push(0, 1);
  q.Push(5, 2);
  q.Push(0, 3);
  q.Push(5, 4);
  q.Push(-3, 5);
  std::vector<int> order;
  while (auto v = q.TryPop()) order.push_back(*v);
  EXPECT_EQ(order, (std::vector<int>{2, 4, 1, 3, 5}));
}

TEST(SliceQueueTest, WaterMarkBoundsInFlight) {
  SliceQueue<int> q(2);
  for (int i = 0; i < 5; ++i) q.Push(0, i);
  EXPECT_EQ(*q.TryPop(), 0);
  EXPECT_EQ(*q.TryPop(), 1);
  EXPECT_FALSE(q.TryPop().has_value());  // two in flight
  EXPECT_EQ(q.in_flight(), 2);
  EXPECT_EQ(q.queued(), 3u);
  q.Release();
  EXPECT_EQ(*q.TryPop(), 2);
  EXPECT_FALSE(q.TryPop().has_value());
}

TEST(SliceQueueTest, LateHighPriorityOvertakesQueuedTail) {
  SliceQueue<int> q(1);
  for (int i = 0; i < 3; ++i) q.Push(-1, i);  // a big layer's slices
  EXPECT_EQ(*q.TryPop(), 0);
  q.Push(0, 100);  // layer 0 arrives while slice 0 is on the wire
  q.Release();
  EXPECT_EQ(*q.TryPop(), 100);
}

TEST(SliceQueueTest, ZeroWaterMarkMeansOne) {
  SliceQueue<int> q(0);
  q.Push(0, 1);
  q.Push(0, 2);
  EXPECT_TRUE(q.TryPop().has_value());
  EXPECT_FALSE(q.TryPop().has_value());
}

TEST(SliceQueueTest, ConcurrentProducersAndConsumersLoseNothing) {
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 5000;
  constexpr int kWaterMark = 3;
  SliceQueue<int> q(kWaterMark);
  std::vector<std::atomic<int>> seen(kProducers * kPerProducer);
  std::atomic<int> popped{0};
  std::atomic<int> max_in_flight{0};
  std::atomic<int> in_flight{0};
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) q.Push(i % 7, p * kPerProducer + i);
    });
  }
  for (int c = 0; c < 3; ++c) {
    threads.emplace_back([&] {
      while (popped.load() < kProducers * kPerProducer) {
        auto v = q.TryPop();
        if (!v) {
          std::this_thread::yield();
          continue;
        }
        int now = in_flight.fetch_add(1) + 1;
        int prev = max_in_flight.load();
        while (now > prev && !max_in_flight.compare_exchange_weak(prev, now)) {
        }
        seen[*v].fetch_add(1);
        popped.fetch_add(1);
        in_flight.fetch_sub(1);
        q.Release();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i].load(), 1) << "item " << i;
  EXPECT_LE(max_in_flight.load(), kWaterMark);
  EXPECT_EQ(q.queued(), 0u);
  EXPECT_EQ(q.in_flight(), 0);
}

}  // namespace
}  // namespace trellis
