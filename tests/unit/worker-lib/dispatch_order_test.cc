// The order slices reach their transport is the queue's order, whatever thread pops them.
// A slice's "sent" callback frees its place and pumps the queue on a transport thread; if that
// thread is preempted between popping a slice and handing it over, another thread that pumps
// meanwhile must not hand over a later slice first. The fake link below stalls exactly there
// (inside Write of the key's last slice) while the test pushes a second key, which makes
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

// An answer without payload.
class NoPayload final : public link::AnswerPayload {
 public:
  uint64_t bytes() const override { return 0; }
  Status ReadInto(void*, link::WriteGuard*) override { return Status::Ok(); }
  StatusOr<wire::Chunks> View() override { return wire::Chunks{}; }
};

// Records the order requests are handed over; runs each "sent" callback, then the answer, on a
// thread of its own (a transport writer that finished a write, then a reader).
class StallingLink : public link::WorkerLink {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> order;  // GUARDED_BY(mu): "key/slice" as handed over
    bool stalled = false;            // GUARDED_BY(mu): Write of kFirst's last slice waits
    bool go = false;                 // GUARDED_BY(mu): the test let it continue
    bool wire_open = false;          // GUARDED_BY(mu): sent/reply threads may run
    int sent_done = 0;               // GUARDED_BY(mu): requests whose sent and reply ran
    std::vector<std::thread> threads;  // GUARDED_BY(mu)
  };
  explicit StallingLink(Shared* shared) : shared_(shared) {}
  // The test joined every thread before the worker goes; nothing is pending any more.
  ~StallingLink() override { receiver_->OnClosed(CancelledError("link closed")); }
  void Start(link::LinkReceiver* receiver) override { receiver_ = receiver; }
  void Write(link::OutFrame f) override {
    wire::RequestHeader r;
    EXPECT_TRUE(wire::ParseRequestHeader(f.first.head, &r).ok());
    std::unique_lock lock(shared_->mu);
    if (r.key == kFirst && r.slice == 2) {
      shared_->stalled = true;
      shared_->cv.notify_all();
      // Bounded: with the fix the test's push returns at once and lets this go; without it
      // the wait ends by itself and the order shows the reorder.
      shared_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return shared_->go; });
    }
    shared_->order.push_back(std::to_string(r.key) + "/" + std::to_string(r.slice));
    shared_->threads.emplace_back(
        [s = shared_, receiver = receiver_, sent = std::move(f.sent), id = r.request_id] {
          {
            std::unique_lock l(s->mu);
            s->cv.wait(l, [s] { return s->wire_open; });
          }
          if (sent) sent();
          wire::ResponseHeader answer;
          answer.request_id = id;
          NoPayload payload;
          receiver->OnAnswer(answer, "", payload);
          std::lock_guard l(s->mu);
          ++s->sent_done;
          s->cv.notify_all();
        });
  }

 private:
  Shared* shared_;
  link::LinkReceiver* receiver_ = nullptr;
};

TEST(DispatchOrderTest, ASlicePoppedBeforeAnotherThreadPumpsReachesTheTransportFirst) {
  StallingLink::Shared shared;
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
  setup.connect = [&shared](const ConnectionOptions&) -> StatusOr<ServerLink> {
    return ServerLink{std::make_unique<StallingLink>(&shared),
                      [](const v1::ShardMap&, int32_t, int64_t) { return Status::Ok(); }};
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
