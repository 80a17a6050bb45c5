// A server resize on the servers (pserver/slice_handover.h): a new shard map installed on every
// server, each moved slice's state taken from its old owner and given to its new one between two
// steps, and the steps after it computed exactly as without the move.
#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "datapath/handover.h"
#include "pserver/slice_store.h"
#include "scheduler/shard_map.h"
#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using testing::Split;

constexpr uint64_t kKey = 7;
constexpr int64_t kElements = 24;
constexpr int64_t kSliceBytes = 16;  // 6 slices of 4 elements
constexpr int32_t kWorkers = 2;

v1::ShardMap MapOn(int32_t servers, int64_t world_epoch) {
  v1::ShardMap m = store_testing::OneKeyMap(kKey, kElements, servers, kSliceBytes);
  m.set_world_epoch(world_epoch);
  return m;
}

OptimizerSpec Adam() {
  OptimizerSpec a;
  a.type = OptimizerType::kAdam;
  a.learningRate = 0.01;
  return a;
}

// A request of `op` with raw payload bytes, split into 3-byte chunks (fields straddle them).
// The reply, if it came (a push-pull's waits for the step's other pushes).
Got SendRaw(SliceStore* store, int32_t worker, wire::Op op, uint32_t slice, int64_t step,
            const std::vector<uint8_t>& payload) {
  wire::RequestHeader h;
  h.op = op;
  h.key = kKey;
  h.slice = slice;
  h.step = step;
  h.payload_bytes = payload.size();
  std::vector<uint8_t> bytes(wire::kRequestHeaderBytes);
  wire::EncodeRequestHeader(h, bytes.data());
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  auto chunks = Split(bytes, 3);
  uint64_t id;
  Got got;
  EXPECT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
  store->Handle(worker, h, chunks, got.reply());
  return got;
}

// A data request (push, pull, init) of `values`.
Got Data(SliceStore* store, int32_t worker, wire::Op op, uint32_t slice, int64_t step,
         const std::vector<float>& values) {
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  return SendRaw(store, worker, op, slice, step,
                 std::vector<uint8_t>(p, p + values.size() * sizeof(float)));
}

Got HandOut(SliceStore* store, int32_t worker, uint32_t slice, int64_t step, wire::HandoverPart part) {
  Got got = SendRaw(store, worker, wire::Op::kHandOut, slice, step, wire::EncodeHandoverPart(part));
  EXPECT_TRUE(got.called);
  return got;
}

Got HandIn(SliceStore* store, int32_t worker, uint32_t slice, wire::HandoverPart part,
           const std::vector<float>& words) {
  std::vector<uint8_t> payload = wire::EncodeHandoverPart(part);
  const auto* p = reinterpret_cast<const uint8_t*>(words.data());
  payload.insert(payload.end(), p, p + words.size() * sizeof(float));
  Got got = SendRaw(store, worker, wire::Op::kHandIn, slice, 0, payload);
  EXPECT_TRUE(got.called);
  return got;
}

// The job's servers: a store per rank and the map in force.
class Servers {
 public:
  Servers(int32_t count, ServerMode mode) : mode_(mode) {
    map_ = MapOn(count, 0);
    Grow(count);
    Install(map_);
  }

  SliceStore* at(int32_t rank) { return stores_[rank].get(); }
  SliceStore* owner(uint32_t slice) { return at(map_.keys(0).slices(slice).server()); }
  int slices() const { return map_.keys(0).slices_size(); }
  const v1::ShardMap& map() const { return map_; }

  // Worker 0 initializes every slice with `values`.
  void Init(const std::vector<float>& values) {
    for (uint32_t j = 0; j < static_cast<uint32_t>(slices()); ++j) {
      Got got = Data(owner(j), 0, wire::Op::kInit, j, 0, Part(values, j));
      ASSERT_TRUE(got.status.ok()) << got.status.ToString();
    }
  }

  // Both workers push step `step` (gradients g0, g1) to every slice's owner; returns the step's
  // answer as the key's elements.
  std::vector<float> Step(int64_t step, const std::vector<float>& g0, const std::vector<float>& g1) {
    std::vector<float> out;
    for (uint32_t j = 0; j < static_cast<uint32_t>(slices()); ++j) {
      Got a = Data(owner(j), 0, wire::Op::kPushPull, j, step, Part(g0, j));
      Got b = Data(owner(j), 1, wire::Op::kPushPull, j, step, Part(g1, j));
      EXPECT_TRUE(a.called && b.called) << "step " << step << " slice " << j;
      EXPECT_TRUE(b.status.ok()) << b.status.ToString();
      EXPECT_EQ(0, std::memcmp(a.values.data(), b.values.data(), b.values.size() * sizeof(float)));
      out.insert(out.end(), b.values.begin(), b.values.end());
    }
    return out;
  }

  // The server resize to `count` servers after step `done`, as every worker does it at the
  // boundary: the map installed on every server (those it starts included), then each worker
  // takes every part of every moved slice from its old owner and hands it to the new one.
  void Resize(int32_t count, int64_t done) {
    const v1::ShardMap next = MapOn(count, map_.world_epoch() + 1);
    Grow(count);
    Install(next);
    for (int32_t worker = 0; worker < kWorkers; ++worker) {
      for (uint32_t j = 0; j < static_cast<uint32_t>(slices()); ++j) {
        const int32_t from = map_.keys(0).slices(j).server();
        const int32_t to = next.keys(0).slices(j).server();
        if (from == to) continue;
        std::vector<wire::HandoverPart> parts = {wire::HandoverPart::kState};
        if (mode_ == ServerMode::kUpdate) {
          parts.push_back(wire::HandoverPart::kOptimizerM);
          parts.push_back(wire::HandoverPart::kOptimizerV);
        }
        for (auto part : parts) {
          Got out = HandOut(at(from), worker, j, done, part);
          ASSERT_TRUE(out.status.ok()) << "slice " << j << ": " << out.status.ToString();
          Got in = HandIn(at(to), worker, j, part, out.values);
          ASSERT_TRUE(in.status.ok()) << "slice " << j << ": " << in.status.ToString();
        }
        ++moved_;
      }
    }
    map_ = next;
  }
  int moved() const { return moved_; }

 private:
  static std::vector<float> Part(const std::vector<float>& all, uint32_t slice) {
    const auto begin = all.begin() + slice * (kSliceBytes / 4);
    return std::vector<float>(begin, begin + kSliceBytes / 4);
  }
  void Grow(int32_t count) {
    while (static_cast<int32_t>(stores_.size()) < count) {
      StoreConfig c;
      c.server_rank = static_cast<int32_t>(stores_.size());
      c.num_workers = kWorkers;
      c.mode = mode_;
      c.optimizer = Adam();
      stores_.push_back(std::make_unique<SliceStore>(c));
    }
  }
  void Install(const v1::ShardMap& map) {
    for (auto& s : stores_) {
      int64_t slices = 0, bytes = 0;
      Status st = s->Install(map, &slices, &bytes);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }

  const ServerMode mode_;
  v1::ShardMap map_;
  std::vector<std::unique_ptr<SliceStore>> stores_;
  int moved_ = 0;
};

// Deterministic gradients that differ per worker, step and element, with no round numbers.
std::vector<float> Grad(int32_t worker, int64_t step) {
  std::vector<float> g(kElements);
  for (int64_t i = 0; i < kElements; ++i) {
    g[i] = 0.1f * static_cast<float>((i * 7 + step * 13 + worker * 29) % 17) - 0.77f + 1e-3f * step;
  }
  return g;
}

class SliceHandoverTest : public ::testing::TestWithParam<ServerMode> {};

// Servers 2 -> 3 -> 1 with 2 workers: every step's answer, bit for bit, is the one a job on a
// single server that never resized gives (the sums are the same; in update mode Adam's moments
// and step move with the slices).
TEST_P(SliceHandoverTest, ServersTwoToThreeToOneGiveTheUndisturbedModelBitForBit) {
  const ServerMode mode = GetParam();
  Servers resized(2, mode), undisturbed(1, mode);
  std::vector<float> init(kElements);
  for (int64_t i = 0; i < kElements; ++i) init[i] = 0.5f - 0.03f * static_cast<float>(i);
  resized.Init(init);
  undisturbed.Init(init);
  for (int64_t step = 1; step <= 9; ++step) {
    if (step == 4) resized.Resize(3, 3);
    if (step == 7) resized.Resize(1, 6);
    const auto got = resized.Step(step, Grad(0, step), Grad(1, step));
    const auto want = undisturbed.Step(step, Grad(0, step), Grad(1, step));
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
        << "step " << step << ": the resized servers' answer differs";
  }
  EXPECT_GT(resized.moved(), 0);
  // The servers the shrink left hold nothing; the one left holds every slice at step 9.
  for (uint32_t j = 0; j < 6; ++j) {
    EXPECT_EQ(resized.at(0)->CompleteStep(kKey, j), 9);
    EXPECT_EQ(resized.at(1)->CompleteStep(kKey, j), -1);
    EXPECT_EQ(resized.at(2)->CompleteStep(kKey, j), -1);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SliceHandoverTest,
                         ::testing::Values(ServerMode::kAggregate, ServerMode::kUpdate),
                         [](const auto& info) {
                           return info.param == ServerMode::kUpdate ? "Update" : "Aggregate";
                         });

// The old owner refuses requests for a slice it handed away, naming its new owner, and frees its
// state once every worker of the world took every part; until then a worker may ask again.
TEST(SliceHandoverTest, AMovedSliceIsRefusedByItsOldOwnerAndFreedOnceEveryWorkerTookIt) {
  Servers s(1, ServerMode::kAggregate);
  s.Init(std::vector<float>(kElements, 1.0f));
  s.Step(1, Grad(0, 1), Grad(1, 1));
  SliceStore* old_owner = s.at(0);
  v1::ShardMap two = MapOn(2, 1);
  int64_t slices = 0, bytes = 0;
  ASSERT_TRUE(old_owner->Install(two, &slices, &bytes).ok());
  EXPECT_EQ(slices, 3);  // slices 1, 3, 5 went to server 1

  Got push = Data(old_owner, 0, wire::Op::kPush, 1, 2, std::vector<float>(4, 1.0f));
  EXPECT_EQ(push.status.code(), StatusCode::kNotFound);
  EXPECT_NE(push.status.message().find("slice 1 is held by server 1, not server 0"), std::string::npos)
      << push.status.message();

  Got first = HandOut(old_owner, 0, 1, 1, wire::HandoverPart::kState);
  ASSERT_TRUE(first.status.ok()) << first.status.ToString();
  EXPECT_EQ(first.values.size(), wire::kHandoverStateWords + 4);
  Got again = HandOut(old_owner, 0, 1, 1, wire::HandoverPart::kState);  // worker 0 restarted
  ASSERT_TRUE(again.status.ok()) << again.status.ToString();
  EXPECT_EQ(again.values, first.values);
  Got second = HandOut(old_owner, 1, 1, 1, wire::HandoverPart::kState);
  ASSERT_TRUE(second.status.ok()) << second.status.ToString();
  Got late = HandOut(old_owner, 1, 1, 1, wire::HandoverPart::kState);
  EXPECT_EQ(late.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status.message().find("was handed to server 1 and every worker took its state: it "
                                       "is freed here"),
            std::string::npos)
      << late.status.message();
  // Aggregate mode keeps no optimizer state to hand over.
  Got m = HandOut(old_owner, 0, 3, 1, wire::HandoverPart::kOptimizerM);
  EXPECT_EQ(m.status.code(), StatusCode::kNotFound);
  EXPECT_EQ(m.status.message(), "handout: optimizer m of key 7 (w) slice 3: the optimizer keeps none");
}

// A worker lost for good (docs/elastic.md#losing-a-worker) is not waited for: the others took
// the moved slice's state, and it is freed once the loss arrives.
TEST(SliceHandoverTest, AWorkerLostForGoodDoesNotHoldAMovedSliceBack) {
  StoreConfig c;
  c.num_workers = 3;
  SliceStore store(c);
  int64_t slices = 0, bytes = 0;
  ASSERT_TRUE(store.Install(MapOn(1, 0), &slices, &bytes).ok());
  for (int32_t w = 0; w < 3; ++w) {
    Got push = Data(&store, w, wire::Op::kPush, 1, 1, std::vector<float>(4, 1.0f));
    ASSERT_TRUE(push.status.ok()) << push.status.ToString();
  }
  ASSERT_TRUE(store.Install(MapOn(2, 1), &slices, &bytes).ok());  // slice 1 goes to server 1
  for (int32_t w = 0; w < 2; ++w) {
    Got got = HandOut(&store, w, 1, 1, wire::HandoverPart::kState);
    ASSERT_TRUE(got.status.ok()) << got.status.ToString();
  }
  Got waiting = HandOut(&store, 0, 1, 1, wire::HandoverPart::kState);
  ASSERT_TRUE(waiting.status.ok()) << "worker 2 has not taken it: kept";
  ASSERT_TRUE(store.LoseWorker(2, 1).ok());
  Got freed = HandOut(&store, 0, 1, 1, wire::HandoverPart::kState);
  EXPECT_EQ(freed.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(freed.status.message().find("it is freed here"), std::string::npos)
      << freed.status.message();
}

// A server a resize's map gives no slice may exit (pserver_main: docs/elastic.md#servers), but
// only once every worker took every slice it moved away; a first map without slices is no resize.
TEST(SliceHandoverTest, AServerIsResizedAwayOnceEveryWorkerTookEverySliceItHeld) {
  StoreConfig c;
  c.num_workers = 2;
  c.server_rank = 1;
  SliceStore store(c);
  int64_t slices = 0, bytes = 0;
  ASSERT_TRUE(store.Install(MapOn(2, 0), &slices, &bytes).ok());
  EXPECT_EQ(store.ResizedAway(), 0);
  std::vector<uint32_t> held;
  for (uint32_t slice = 0; slice < static_cast<uint32_t>(kElements / 4); ++slice) {
    if (slice % 2 == 1) held.push_back(slice);  // round robin: the odd slices are server 1's
  }
  for (uint32_t slice : held) {
    for (int32_t w = 0; w < 2; ++w) {
      Got push = Data(&store, w, wire::Op::kPush, slice, 1, std::vector<float>(4, 1.0f));
      ASSERT_TRUE(push.status.ok()) << slice << ": " << push.status.ToString();
    }
  }
  ASSERT_TRUE(store.Install(MapOn(1, 2), &slices, &bytes).ok());  // 2 -> 1: all on server 0
  EXPECT_EQ(store.ResizedAway(), 0) << "no worker took the slices yet";
  for (uint32_t slice : held) {
    for (int32_t w = 0; w < 2; ++w) {
      EXPECT_EQ(store.ResizedAway(), 0) << "slice " << slice << " not taken by every worker yet";
      Got got = HandOut(&store, w, slice, 1, wire::HandoverPart::kState);
      ASSERT_TRUE(got.status.ok()) << slice << ": " << got.status.ToString();
    }
  }
  EXPECT_EQ(store.ResizedAway(), 2) << "the world of the map that removed it";
}

// Bad handovers get a clear error and change nothing: a slice not moved, the wrong step, an
// unknown part, a state block that does not parse or carries the wrong count, a moment before
// the state, a slice that already trained here; a slice still moving in takes no data request.
TEST(SliceHandoverTest, BadHandoversAreRefusedAndChangeNothing) {
  // Slice 4 moves from server 0 to server 1 when 2 servers become 3 (round robin).
  Servers s(2, ServerMode::kUpdate);
  s.Init(std::vector<float>(kElements, 1.0f));
  s.Step(1, Grad(0, 1), Grad(1, 1));
  s.Step(2, Grad(0, 2), Grad(1, 2));
  SliceStore* old_owner = s.at(0);
  SliceStore* new_owner = s.at(1);
  int64_t slices = 0, bytes = 0;

  Got held = HandOut(old_owner, 0, 4, 2, wire::HandoverPart::kState);
  EXPECT_EQ(held.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(held.status.message().find("is held by server 0 under the installed shard map (world "
                                       "epoch 0): nothing moved it away"),
            std::string::npos)
      << held.status.message();

  // Maps that cannot replace the installed one.
  v1::ShardMap resliced = store_testing::OneKeyMap(kKey, kElements, 3, 2 * kSliceBytes);
  resliced.set_world_epoch(1);
  Status st = old_owner->Install(resliced, &slices, &bytes);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("another sliceBytes"), std::string::npos) << st.message();
  v1::ShardMap out_of_range = MapOn(3, 1);
  out_of_range.mutable_keys(0)->mutable_slices(1)->set_server(5);
  st = old_owner->Install(out_of_range, &slices, &bytes);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("key 7 slice 1 on server 5 of 3"), std::string::npos) << st.message();

  const v1::ShardMap three = MapOn(3, 1);
  ASSERT_TRUE(old_owner->Install(three, &slices, &bytes).ok());
  ASSERT_TRUE(new_owner->Install(three, &slices, &bytes).ok());
  st = old_owner->Install(MapOn(2, 0), &slices, &bytes);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("it is older"), std::string::npos) << st.message();

  Got wrong_step = HandOut(old_owner, 0, 4, 1, wire::HandoverPart::kState);
  EXPECT_EQ(wrong_step.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong_step.status.message().find("completed step 2; the handover is of step 1"),
            std::string::npos)
      << wrong_step.status.message();
  Got bad_part = SendRaw(old_owner, 0, wire::Op::kHandOut, 4, 2, {9, 0, 0, 0});
  EXPECT_EQ(bad_part.status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad_part.status.message(), "handover: unknown part 9");
  Got long_ask = SendRaw(old_owner, 0, wire::Op::kHandOut, 4, 2, {0, 0, 0, 0, 1, 2});
  EXPECT_EQ(long_ask.status.code(), StatusCode::kInvalidArgument);

  Got state = HandOut(old_owner, 0, 4, 2, wire::HandoverPart::kState);
  ASSERT_TRUE(state.status.ok()) << state.status.ToString();
  Got m = HandOut(old_owner, 0, 4, 2, wire::HandoverPart::kOptimizerM);
  ASSERT_TRUE(m.status.ok()) << m.status.ToString();

  Got early_m = HandIn(new_owner, 0, 4, wire::HandoverPart::kOptimizerM, m.values);
  EXPECT_EQ(early_m.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(early_m.status.message(), "handin: optimizer m of key 7 (w) slice 4 before its state part");
  std::vector<float> bad_magic = state.values;
  bad_magic[0] = 0.0f;
  Got magic = HandIn(new_owner, 0, 4, wire::HandoverPart::kState, bad_magic);
  EXPECT_EQ(magic.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(magic.status.message().find("does not start with TRH1"), std::string::npos)
      << magic.status.message();
  std::vector<float> short_state(state.values.begin(), state.values.end() - 1);
  Got count = HandIn(new_owner, 0, 4, wire::HandoverPart::kState, short_state);
  EXPECT_EQ(count.status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(count.status.message().find("has 4 elements; the state part carries 12 bytes"),
            std::string::npos)
      << count.status.message();

  // Nothing arrived yet: the slice the map moved here takes no pull...
  Got pull = Data(new_owner, 0, wire::Op::kPull, 4, 2, {});
  EXPECT_EQ(pull.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(pull.status.message().find("key 7 (w) slice 4 is moving here at a server resize from "
                                       "server 0"),
            std::string::npos)
      << pull.status.message();
  // ... nor once the state arrived, while a moment is still missing.
  ASSERT_TRUE(HandIn(new_owner, 0, 4, wire::HandoverPart::kState, state.values).status.ok());
  Got half = Data(new_owner, 0, wire::Op::kPull, 4, 2, {});
  EXPECT_EQ(half.status.code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(HandIn(new_owner, 0, 4, wire::HandoverPart::kOptimizerM, m.values).status.ok());
  Got v = HandOut(old_owner, 0, 4, 2, wire::HandoverPart::kOptimizerV);
  ASSERT_TRUE(v.status.ok()) << v.status.ToString();
  ASSERT_TRUE(HandIn(new_owner, 0, 4, wire::HandoverPart::kOptimizerV, v.values).status.ok());
  Got whole = Data(new_owner, 0, wire::Op::kPull, 4, 2, {});
  ASSERT_TRUE(whole.status.ok()) << whole.status.ToString();
  EXPECT_EQ(whole.values.size(), 4u);

  // A repeat of the same step changes nothing; another step is refused.
  EXPECT_TRUE(HandIn(new_owner, 1, 4, wire::HandoverPart::kState, state.values).status.ok());
  std::vector<float> other = state.values;
  uint8_t block[wire::kHandoverStateBytes];
  std::memcpy(block, other.data(), sizeof(block));
  wire::HandoverState parsed;
  ASSERT_TRUE(wire::ParseHandoverState(block, &parsed).ok());
  parsed.complete = 5;
  wire::EncodeHandoverState(parsed, block);
  std::memcpy(other.data(), block, sizeof(block));
  Got crossed = HandIn(new_owner, 1, 4, wire::HandoverPart::kState, other);
  EXPECT_EQ(crossed.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(crossed.status.message(), "handin: key 7 (w) slice 4 was handed in at step 2, not 5");
  // A slice that trained here is no handover's target (slice 0 stays on server 0).
  Got trained = HandIn(old_owner, 0, 0, wire::HandoverPart::kState, state.values);
  EXPECT_EQ(trained.status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(trained.status.message().find("already holds step 2"), std::string::npos)
      << trained.status.message();
}

}  // namespace
}  // namespace trellis
