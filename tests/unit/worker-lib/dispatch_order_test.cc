// The order slices reach their transport is the queue's order, whatever thread pops them.
// A slice's "sent" callback frees its place and pumps the queue on a transport thread; if that
// thread is preempted between popping a slice and handing it over, another thread that pumps
// meanwhile must not hand over a later slice first. The fake connection below stalls exactly
// there (inside Send of the key's last slice) while the test pushes a second key, which makes
// the preemption deterministic. Before the fix (any thread could drain concurrently), the
// second key reached the transport ahead of the first key's last slice; that is the reorder
// CI saw in integration.PriorityOrderTest.WithPriorityOffKeysCompleteInIssueOrder.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "scheduler/shard_map.h"
#include "worker-lib/src/worker_impl.h"

namespace trellis {
namespace {

constexpr KeyId kFirst = 1;   // three slices
constexpr KeyId kSecond = 2;  // one slice, pushed after kFirst
constexpr int64_t kSliceBytes = 1024;

// Records the order requests are handed over; runs each "sent" callback, then the answer, on a
// thread of its own (a transport writer that finished a write, then a reader).
class StallingConnection : public ServerConnection {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> order;  // GUARDED_BY(mu): "key/slice" as handed over
    bool stalled = false;            // GUARDED_BY(mu): Send of kFirst's last slice waits
    bool go = false;                 // GUARDED_BY(mu): the test let it continue
    bool wire_open = false;          // GUARDED_BY(mu): sent/reply threads may run
    int sent_done = 0;               // GUARDED_BY(mu): requests whose sent and reply ran
    std::vector<std::thread> threads;  // GUARDED_BY(mu)
  };
  explicit StallingConnection(Shared* shared) : shared_(shared) {}
  const std::string& address() const override { return address_; }
  Status InstallShardMap(const v1::ShardMap&, int32_t, int64_t) override { return Status::Ok(); }
  void Send(const SliceRequest& r, SliceReply reply, SliceSent sent) override {
    {
      std::unique_lock lock(shared_->mu);
      if (r.key == kFirst && r.slice == 2) {
        shared_->stalled = true;
        shared_->cv.notify_all();
        // Bounded: with the fix the test's push returns at once and lets this go; without it
        // the wait ends by itself and the order shows the reorder.
        shared_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return shared_->go; });
      }
      shared_->order.push_back(std::to_string(r.key) + "/" + std::to_string(r.slice));
      shared_->threads.emplace_back([s = shared_, sent = std::move(sent), reply = std::move(reply)] {
        {
          std::unique_lock l(s->mu);
          s->cv.wait(l, [s] { return s->wire_open; });
        }
        if (sent) sent();
        reply(Status::Ok(), Payload{});
        std::lock_guard l(s->mu);
        ++s->sent_done;
        s->cv.notify_all();
      });
    }
  }
  void SendBulk(const std::vector<SliceRequest>& requests, std::vector<SliceReply> replies,
                SliceSent sent) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      Send(requests[i], std::move(replies[i]), i + 1 == requests.size() ? sent : nullptr);
    }
  }

 private:
  Shared* shared_;
  const std::string address_ = "fake:1";
};

TEST(DispatchOrderTest, ASlicePoppedBeforeAnotherThreadPumpsReachesTheTransportFirst) {
  StallingConnection::Shared shared;
  WorkerSetup setup;
  setup.server_addresses = {"fake:1"};
  setup.token = "tok";
  setup.water_mark = 2;
  setup.priority_enabled = false;
  setup.bulking.enabled = false;
  setup.timeout_ms = 30000;
  setup.declare = [](const std::vector<v1::KeySpec>& keys) {
    return BuildShardMap(keys, 1, "roundRobin", kSliceBytes);
  };
  setup.connect = [&shared](const ConnectionOptions&)
      -> StatusOr<std::unique_ptr<ServerConnection>> {
    return std::unique_ptr<ServerConnection>(new StallingConnection(&shared));
  };
  auto worker = CreateWorker(std::move(setup));
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  Worker& w = **worker;
  ASSERT_TRUE(w.DeclareKey({.id = kFirst, .name = "first", .num_elements = 3 * kSliceBytes / 4}).ok());
  ASSERT_TRUE(w.DeclareKey({.id = kSecond, .name = "second", .num_elements = 16}).ok());
  ASSERT_TRUE(w.FinishDeclarations().ok());

  std::vector<float> first(3 * kSliceBytes / 4, 1.0f), second(16, 2.0f);
  // Slices 0 and 1 take both places (on this thread, the wire still closed); then the first
  // "sent" pops slice 2 on its thread and stalls in Send; the other "sent" frees a place.
  Handle a = w.Push(kFirst, first.data());
  {
    std::unique_lock lock(shared.mu);
    shared.wire_open = true;
    shared.cv.notify_all();
    ASSERT_TRUE(shared.cv.wait_for(lock, std::chrono::seconds(10),
                                   [&] { return shared.stalled && shared.sent_done >= 1; }));
  }
  // A place is free and kFirst's slice 2 is popped but not handed over: this push must not
  // overtake it.
  Handle b = w.Push(kSecond, second.data());
  {
    std::lock_guard lock(shared.mu);
    shared.go = true;
  }
  shared.cv.notify_all();
  EXPECT_TRUE(a.Wait().ok()) << a.Wait().ToString();
  EXPECT_TRUE(b.Wait().ok()) << b.Wait().ToString();
  std::vector<std::thread> threads;
  {
    std::unique_lock lock(shared.mu);
    EXPECT_TRUE(shared.cv.wait_for(lock, std::chrono::seconds(10), [&] { return shared.sent_done == 4; }));
    threads.swap(shared.threads);
  }
  for (auto& t : threads) t.join();  // their callbacks touch the worker: before it goes
  worker->reset();
  EXPECT_EQ(shared.order, (std::vector<std::string>{"1/0", "1/1", "1/2", "2/0"}));
}

}  // namespace
}  // namespace trellis
