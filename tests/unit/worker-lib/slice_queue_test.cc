#include "worker-lib/src/slice_queue.h"

#include <algorithm>
#include <array>
#include <climits>
#include <string>
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

// Within one priority nothing overtakes: every producer's items come out in the order it pushed
// them, however the producers interleave (FIFO = no starvation inside a band).
TEST(SliceQueueTest, FifoWithinPriorityUnderConcurrentProducers) {
  constexpr int kProducers = 4;
  constexpr int kPerProducer = 3000;
  SliceQueue<int> q(1 << 20);
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (int i = 0; i < kPerProducer; ++i) q.Push(-(i % 3), p * kPerProducer + i);
    });
  }
  for (auto& t : producers) t.join();
  std::vector<int> last(kProducers * 3, -1);  // [producer * 3 + band]: last index seen
  int prev_priority = 0;
  int count = 0;
  while (auto v = q.TryPop()) {
    const int p = *v / kPerProducer, i = *v % kPerProducer, prio = -(i % 3);
    ASSERT_LE(prio, prev_priority) << "a lower priority came out before a higher one";
    prev_priority = prio;
    int& seen = last[p * 3 + (i % 3)];
    ASSERT_GT(i, seen) << "producer " << p << " item " << i << " overtaken within its priority";
    seen = i;
    ++count;
  }
  EXPECT_EQ(count, kProducers * kPerProducer);
}

TEST(SliceQueueTest, DepthByBand) {
  SliceQueue<int> q(1);
  q.Push(0, 1);          // band 0: layer 0
  q.Push(-3, 2);         // band 1-9
  q.Push(-9, 3);
  q.Push(-10, 4);        // band 10-99
  q.Push(-250, 5);       // band 100+
  q.Push(INT32_MAX - 1, 6);  // broadcasts count as band 0
  EXPECT_EQ(q.queued_by_band(), (std::array<size_t, 4>{2, 2, 1, 1}));
  ASSERT_EQ(*q.TryPop(), 6);
  EXPECT_EQ(q.queued_by_band(), (std::array<size_t, 4>{1, 2, 1, 1}));
  EXPECT_EQ(std::string(SliceQueue<int>::kBandNames[SliceQueue<int>::Band(-42)]), "10-99");
}

// Shutdown fails everything still queued, even while every place is taken.
TEST(SliceQueueTest, TakeAllEmptiesTheQueueWhateverIsInFlight) {
  SliceQueue<int> q(1);
  for (int i = 0; i < 4; ++i) q.Push(-i, i);
  ASSERT_EQ(*q.TryPop(), 0);
  EXPECT_FALSE(q.TryPop().has_value());  // the one place is taken
  EXPECT_EQ(q.TakeAll(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(q.queued(), 0u);
  EXPECT_EQ(q.queued_by_band(), (std::array<size_t, 4>{0, 0, 0, 0}));
}

// A bulk grows only from the head of the queue: TryPopIf never reaches past an item that does
// not fit, and takes no extra place.
TEST(SliceQueueTest, TryPopIfTakesOnlyTheHeadAndNoPlace) {
  SliceQueue<int> q(1);
  q.Push(0, 10);
  q.Push(0, 11);
  q.Push(0, 99);  // does not fit
  q.Push(0, 12);
  ASSERT_EQ(*q.TryPop(), 10);
  auto small = [](int v) { return v < 50; };
  EXPECT_EQ(*q.TryPopIf(small), 11);
  EXPECT_FALSE(q.TryPopIf(small).has_value());  // 99 is next: 12 must not jump it
  EXPECT_EQ(q.in_flight(), 1);
  EXPECT_EQ(q.queued(), 2u);
}

}  // namespace
}  // namespace trellis
