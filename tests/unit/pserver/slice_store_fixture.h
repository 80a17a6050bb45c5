// The SliceStore test fixture: a store with one key of 4 elements, requests as chunked frames
// (floats and 2-bit frames straddling chunks), and replies captured. Shared by the store's tests
// (slice_store, packed answers, checkpoints, rebuild, rejoin).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "pserver/slice_store.h"
#include "scheduler/shard_map.h"
#include "tests/testing/test_frames.h"
#include "datapath/codec/twobit.h"

namespace trellis::store_testing {

using testing::RequestBytes;
using testing::Split;

inline v1::ShardMap OneKeyMap(uint64_t id, int64_t n, int32_t servers = 1, int64_t slice_bytes = 1 << 20) {
  v1::KeySpec k;
  k.set_id(id);
  k.set_name("w");
  k.set_num_elements(n);
  k.set_dtype(v1::DTYPE_FLOAT32);
  auto m = BuildShardMap({k}, servers, "roundRobin", slice_bytes);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return *m;
}

// Captures one reply.
struct Got {
  bool called = false;
  Status status;
  std::vector<float> values;
  std::vector<uint8_t> packed;  // the packed answer, when the answer went packed
  StoreReply reply() {
    return [this](const Status& s, Answer a) {
      called = true;
      status = s;
      if (a.values) values = *a.values;
      if (a.packed) packed = *a.packed;
    };
  }
};

class SliceStoreTest : public ::testing::Test {
 protected:
  // `slots`: the worker ranks there may be (an elastic job's maxWorkers); 0: `workers`.
  void Make(int32_t workers, ServerMode mode = ServerMode::kAggregate, OptimizerSpec opt = {},
            int32_t slots = 0) {
    StoreConfig c;
    c.num_workers = workers;
    c.worker_slots = slots;
    c.mode = mode;
    c.optimizer = opt;
    store_ = std::make_unique<SliceStore>(c);
    int64_t slices = 0, bytes = 0;
    ASSERT_TRUE(store_->Install(OneKeyMap(7, 4), &slices, &bytes).ok());
    EXPECT_EQ(slices, 1);
    EXPECT_EQ(bytes, 16);
  }
  void Send(int32_t worker, wire::Op op, int64_t step, std::vector<float> v, Got* got,
            uint64_t key = 7, uint32_t slice = 0) {
    auto bytes = RequestBytes(op, key, slice, step, v);
    auto chunks = Split(bytes, 5);  // floats straddle chunks
    wire::RequestHeader h;
    uint64_t id;
    ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
    store_->Handle(worker, h, chunks, got->reply());
  }
  // A 2-bit push of `grad` (threshold t, zero residual), its frame split into 3-byte chunks.
  void SendTwoBit(int32_t worker, wire::Op op, int64_t step, std::vector<float> grad, Got* got,
                  std::vector<uint8_t> frame = {}, float t = 0.5f) {
    if (frame.empty()) {
      std::vector<float> residual(grad.size(), 0.0f);
      frame.resize(TwoBitEncodedBytes(grad.size()));
      ASSERT_TRUE(TwoBitEncode(grad.data(), residual.data(), grad.size(), t, frame.data(),
                               frame.size()).ok());
    }
    wire::RequestHeader h;
    h.op = op;
    h.key = 7;
    h.step = step;
    h.payload_bytes = frame.size();
    std::vector<uint8_t> bytes(wire::kRequestHeaderBytes);
    wire::EncodeRequestHeader(h, bytes.data());
    bytes.insert(bytes.end(), frame.begin(), frame.end());
    auto chunks = Split(bytes, 3);
    uint64_t id;
    ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
    store_->Handle(worker, h, chunks, got->reply());
  }
  // A kWorld from `worker`: world `epoch` of `members`; `payload` replaces the encoded members
  // when set (a bad one).
  void SendWorld(int32_t worker, int64_t epoch, const std::vector<int32_t>& members, Got* got,
                 const std::vector<uint8_t>* payload = nullptr) {
    std::vector<uint8_t> body = payload ? *payload : wire::EncodeWorldMembers(members);
    wire::RequestHeader h;
    h.op = wire::Op::kWorld;
    h.step = epoch;
    h.payload_bytes = body.size();
    std::vector<uint8_t> bytes(wire::kRequestHeaderBytes);
    wire::EncodeRequestHeader(h, bytes.data());
    bytes.insert(bytes.end(), body.begin(), body.end());
    auto chunks = Split(bytes, 3);  // members straddle chunks
    uint64_t id;
    ASSERT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
    store_->Handle(worker, h, chunks, got->reply());
  }
  // A bad 2-bit frame of `op` is refused (INVALID_ARGUMENT, `message`) and does not count: a
  // good push of step 1 from the one worker after it completes the step. Returns its reply.
  Got BadFrameIsRefusedAndDoesNotCount(wire::Op op, std::vector<uint8_t> bad_frame,
                                       const std::string& message) {
    Got bad;
    SendTwoBit(0, op, 1, {}, &bad, std::move(bad_frame));
    EXPECT_TRUE(bad.called);
    EXPECT_EQ(bad.status.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(bad.status.message(), message);
    Got good;
    SendTwoBit(0, op, 1, {1, -1, 0, 0}, &good);
    EXPECT_TRUE(good.status.ok()) << good.status.ToString();
    EXPECT_EQ(good.values, (std::vector<float>{0.5f, -0.5f, 0, 0}));
    return good;
  }
  std::unique_ptr<SliceStore> store_;
};

}  // namespace trellis::store_testing
