// The front door both transports share (pserver/front_door.h), driven by hand: request frames
// in, answer frames out through a recording sink, the serving queue held where order matters.
// What a worker relies on whichever transport it picked: one connection's requests answered
// highest priority first and in arrival order where priorities tie, a malformed bulk refused
// under its own id without ending the connection, the bytes of a request let go of once it is
// served, and answers for a worker that is gone dropped without harm.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "pserver/front_door.h"
#include "scheduler/shard_map.h"
#include "tests/testing/test_frames.h"
#include "tests/unit/pserver/serving_queue_peer.h"

namespace trellis {
namespace {

using testing::BulkBytes;
using testing::RequestBytes;

constexpr int kElements = 4;

// Records every answer; waits for a count.
class RecordingSink : public AnswerSink {
 public:
  struct Got {
    int32_t priority;
    wire::ResponseHeader header;
    std::string message;
    std::vector<float> values;
  };
  void Send(AnswerFrame a) override {
    Got g;
    g.priority = a.priority;
    EXPECT_TRUE(wire::ParseResponseHeader(a.head.data(), &g.header).ok());
    g.message.assign(a.head.begin() + wire::kResponseHeaderBytes, a.head.end());
    if (a.values) g.values = *a.values;
    std::lock_guard lock(mu_);
    got_.push_back(std::move(g));
    cv_.notify_all();
  }
  std::vector<Got> WaitFor(size_t n) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return got_.size() >= n; });
    return got_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Got> got_;
};

// Keys 0..9, one slice each, on one server.
v1::ShardMap TenKeys() {
  std::vector<v1::KeySpec> keys;
  for (int i = 0; i < 10; ++i) {
    v1::KeySpec k;
    k.set_id(i);
    k.set_name("k" + std::to_string(i));
    k.set_num_elements(kElements);
    k.set_dtype(v1::DTYPE_FLOAT32);
    keys.push_back(k);
  }
  auto m = BuildShardMap(keys, 1, "roundRobin", 1 << 20);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// A request frame as a transport hands it over: the bytes held by `hold`.
RequestFrame Frame(std::vector<uint8_t> bytes, std::weak_ptr<void>* watch = nullptr) {
  auto held = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  RequestFrame f;
  f.chunks = {std::span<const uint8_t>(held->data(), held->size())};
  uint64_t id = 0;
  EXPECT_TRUE(wire::DecodeRequest(f.chunks, &f.header, &id).ok());
  if (watch != nullptr) *watch = held;
  f.hold = std::move(held);
  return f;
}

class FrontDoorTest : public ::testing::Test {
 protected:
  void Make(int32_t workers) {
    StoreConfig c;
    c.num_workers = workers;
    store_ = std::make_unique<SliceStore>(c);
    int64_t slices = 0, bytes = 0;
    ASSERT_TRUE(store_->Install(TenKeys(), &slices, &bytes).ok());
  }
  std::vector<float> Ones(float v) { return std::vector<float>(kElements, v); }
  std::shared_ptr<FrontDoor> Door(int32_t worker, std::shared_ptr<AnswerSink> sink) {
    return std::make_shared<FrontDoor>(store_.get(), &serving_, worker, std::move(sink));
  }

  std::unique_ptr<SliceStore> store_;
  ServingQueue serving_{ServingQueueOptions{1, 64 << 10}};
};

TEST_F(FrontDoorTest, WaitingRequestsAreAnsweredByPriorityThenInArrivalOrder) {
  Make(1);
  auto sink = std::make_shared<RecordingSink>();
  auto door = Door(0, sink);
  ServingQueueTestPeer peer(&serving_);
  peer.Hold();
  // Arrival: ids 1 (priority 0), 2 (5), 3 (0), 4 (5), and a bulk (id 9) whose entries have
  // priorities 7 (id 5) and 0 (id 6).
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(1), 1, 0)));
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 1, 0, 1, Ones(2), 2, 5)));
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 2, 0, 1, Ones(3), 3, 0)));
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 3, 0, 1, Ones(4), 4, 5)));
  door->Receive(Frame(BulkBytes({RequestBytes(wire::Op::kPushPull, 4, 0, 1, Ones(5), 5, 7),
                                 RequestBytes(wire::Op::kPushPull, 5, 0, 1, Ones(6), 6, 0)},
                                9, 7)));
  peer.Release();
  auto got = sink->WaitFor(6);
  ASSERT_EQ(got.size(), 6u);
  const uint64_t want[] = {5, 2, 4, 1, 3, 6};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i].header.request_id, want[i]) << "answer " << i;
    EXPECT_EQ(got[i].header.code, 0) << got[i].message;
    // Each answer is its own push summed (one worker), and goes out with its priority.
    EXPECT_EQ(got[i].values, Ones(static_cast<float>(want[i]))) << "answer " << i;
  }
  EXPECT_EQ(got[0].priority, 7);
  EXPECT_EQ(got[5].priority, 0);
}

TEST_F(FrontDoorTest, AMalformedBulkIsRefusedUnderItsIdAndTheConnectionGoesOn) {
  Make(1);
  auto sink = std::make_shared<RecordingSink>();
  auto door = Door(0, sink);
  // A bulk whose body claims one byte more than its entry holds.
  auto bulk = BulkBytes({RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(1), 5)}, 9);
  bulk.push_back(0);
  wire::RequestHeader h;
  ASSERT_TRUE(wire::ParseRequestHeader(bulk.data(), &h).ok());
  h.payload_bytes += 1;
  wire::EncodeRequestHeader(h, bulk.data());
  std::weak_ptr<void> bytes;
  door->Receive(Frame(bulk, &bytes));
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 1, 0, 1, Ones(2), 10)));
  auto got = sink->WaitFor(2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].header.request_id, 9u);
  EXPECT_EQ(got[0].header.code, static_cast<int32_t>(StatusCode::kInvalidArgument));
  EXPECT_NE(got[0].message.find("malformed bulk"), std::string::npos) << got[0].message;
  EXPECT_EQ(got[0].priority, INT32_MAX);  // an error fails the worker's handle at once
  EXPECT_EQ(got[1].header.request_id, 10u);
  EXPECT_EQ(got[1].values, Ones(2));
  EXPECT_TRUE(bytes.expired());  // nothing of the refused bulk is kept
}

TEST_F(FrontDoorTest, ARequestsBytesAreLetGoOfOnceServed) {
  Make(1);
  auto sink = std::make_shared<RecordingSink>();
  auto door = Door(0, sink);
  ServingQueueTestPeer peer(&serving_);
  peer.Hold();
  std::weak_ptr<void> bulk_bytes;
  door->Receive(Frame(BulkBytes({RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(1), 5),
                                 RequestBytes(wire::Op::kPushPull, 1, 0, 1, Ones(1), 6)}, 9),
                      &bulk_bytes));
  EXPECT_FALSE(bulk_bytes.expired());  // waiting: the transport's read-ahead still counts it
  peer.Release();
  ASSERT_EQ(sink->WaitFor(2).size(), 2u);
  // The serving thread lets go of the job just after the answer is handed over.
  for (int i = 0; i < 1000 && !bulk_bytes.expired(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(bulk_bytes.expired());
}

TEST_F(FrontDoorTest, AnAnswerForAWorkerThatIsGoneIsDropped) {
  Make(2);
  auto gone = std::make_shared<RecordingSink>();
  auto door0 = Door(0, gone);
  auto sink1 = std::make_shared<RecordingSink>();
  auto door1 = Door(1, sink1);
  // Worker 0's pushpull waits for worker 1's push; worker 0's connection ends meanwhile.
  door0->Receive(Frame(RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(1), 1)));
  std::weak_ptr<RecordingSink> watch = gone;
  gone.reset();
  door0.reset();
  ASSERT_TRUE(watch.expired());  // nothing the door or the store keeps holds the connection
  door1->Receive(Frame(RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(2), 1)));
  auto got = sink1->WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].values, Ones(3));  // both pushes summed; worker 0's answer went nowhere
}

TEST_F(FrontDoorTest, AStoppedQueueRefusesAndLetsGoOfWhatWaited) {
  Make(1);
  auto sink = std::make_shared<RecordingSink>();
  auto door = Door(0, sink);
  ServingQueueTestPeer peer(&serving_);
  peer.Hold();
  std::weak_ptr<void> waiting;
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 0, 0, 1, Ones(1), 1), &waiting));
  serving_.Stop();  // shutdown with a request waiting
  EXPECT_TRUE(waiting.expired());
  door->Receive(Frame(RequestBytes(wire::Op::kPushPull, 1, 0, 1, Ones(1), 2)));
  auto got = sink->WaitFor(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].header.request_id, 2u);
  EXPECT_EQ(got[0].header.code, static_cast<int32_t>(StatusCode::kUnavailable));
  std::weak_ptr<FrontDoor> d = door;
  door.reset();
  EXPECT_TRUE(d.expired());  // no job left holding the door
}

TEST(CheckWorkerTest, SaysWhatIsWrongWithAConnectingWorker) {
  EXPECT_TRUE(CheckWorker("", "", 0, 1).ok());
  EXPECT_TRUE(CheckWorker("tok", "tok", 1, 2).ok());
  Status missing = CheckWorker("tok", "", 0, 1);
  EXPECT_EQ(missing.code(), StatusCode::kUnauthenticated);
  EXPECT_NE(missing.message().find("missing job token"), std::string::npos);
  EXPECT_EQ(CheckWorker("tok", "tik", 0, 1).message(), "wrong job token");
  // The token is checked first: a wrong token says nothing about ranks.
  EXPECT_EQ(CheckWorker("tok", "tik", 5, 1).code(), StatusCode::kUnauthenticated);
  Status rank = CheckWorker("tok", "tok", 2, 2);
  EXPECT_EQ(rank.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank.message().find("worker rank 2 outside [0, 2)"), std::string::npos);
  EXPECT_EQ(CheckWorker("", "", -1, 2).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace trellis
