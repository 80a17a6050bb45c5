// SliceCheckpoints through the store (pserver/slice_checkpoints.h): a snapshot of the slices in
// update mode, a restore as their step-0 values, and what a file that does not fit gets.
#include "pserver/slice_checkpoints.h"

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "tests/testing/test_frames.h"
#include "tests/unit/pserver/slice_store_fixture.h"

namespace trellis {
namespace {

using store_testing::Got;
using store_testing::OneKeyMap;

// One request from worker 0 straight into `s`; returns the reply.
Got Request(SliceStore& s, wire::Op op, int64_t step, const std::vector<float>& v,
            uint64_t key = 7) {
  auto bytes = testing::RequestBytes(op, key, 0, step, v);
  auto chunks = testing::Split(bytes, 3);
  wire::RequestHeader h;
  uint64_t id;
  EXPECT_TRUE(wire::DecodeRequest(chunks, &h, &id).ok());
  Got g;
  s.Handle(0, h, chunks, g.reply());
  EXPECT_TRUE(g.called);
  return g;
}

// An update-mode store of one worker holding key 7 (4 elements).
std::unique_ptr<SliceStore> UpdateStore(OptimizerSpec optimizer = {}) {
  StoreConfig c;
  c.num_workers = 1;
  c.mode = ServerMode::kUpdate;
  c.optimizer = optimizer;
  auto s = std::make_unique<SliceStore>(c);
  int64_t n = 0, b = 0;
  EXPECT_TRUE(s->Install(OneKeyMap(7, 4), &n, &b).ok());
  return s;
}

// A file of step 5 holding `entries`.
Checkpoint StepFive(std::vector<CheckpointEntry> entries) {
  Checkpoint c;
  c.step = 5;
  c.entries = std::move(entries);
  return c;
}

// A snapshot in update mode carries weights, Adam's m and v, and the optimizer step count; a new
// store restored from it continues exactly like the original (step 0 = the restored weights).
TEST(SliceStoreCheckpointTest, SnapshotRestoreContinuesAdamExactly) {
  OptimizerSpec adam;
  adam.type = OptimizerType::kAdam;
  adam.learningRate = 0.1;
  auto send = [](SliceStore& s, wire::Op op, int64_t step, std::vector<float> v) {
    Got g = Request(s, op, step, v);
    EXPECT_TRUE(g.status.ok()) << g.status.ToString();
    return g.values;
  };
  auto a = UpdateStore(adam);
  send(*a, wire::Op::kInit, 0, {1, 2, 3, 4});
  send(*a, wire::Op::kPushPull, 1, {0.5f, -1, 2, 0});
  send(*a, wire::Op::kPushPull, 2, {0.1f, 0.2f, -0.3f, 4});
  Checkpoint c = a->Snapshot(2, /*skip_key=*/99);
  ASSERT_EQ(c.entries.size(), 3u);  // weights, m, v
  EXPECT_EQ(c.entries[0].step, 2);
  EXPECT_EQ(a->Snapshot(2, /*skip_key=*/7).entries.size(), 0u);

  auto b = UpdateStore(adam);
  ASSERT_TRUE(b->RestoreFrom(c, "f").ok());
  EXPECT_EQ(send(*b, wire::Op::kPull, 0, {}), c.entries[0].values);
  const std::vector<float> g3 = {1, 1, -1, 0.25f};
  const auto want = send(*a, wire::Op::kPushPull, 3, g3);
  EXPECT_EQ(send(*b, wire::Op::kPushPull, 1, g3), want);  // bit for bit, Adam's t continues at 3
}

TEST(SliceStoreCheckpointTest, AFileThatDoesNotFitChangesNothing) {
  auto store = UpdateStore();
  SliceStore& s = *store;
  Checkpoint c = StepFive({{7, 0, EntryKind::kValues, 5, "w", {1, 2, 3, 4}},
                           {7, 3, EntryKind::kValues, 5, "w", {1}}});
  Status st = s.RestoreFrom(c, "/ck/server-0-5.ckpt");
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "/ck/server-0-5.ckpt: key 7 slice 3 is not held by server 0 in this job's shard map "
            "(servers, sliceBytes or keys changed since it was saved)");
  c.entries.pop_back();
  c.entries[0].values.pop_back();
  st = s.RestoreFrom(c, "f");
  EXPECT_NE(st.message().find("f: key 7 (w) slice 0 has 3 values at step 5, the slice has 4"),
            std::string::npos)
      << st.message();
  // Nothing was installed: an update-mode push is still refused for want of an init.
  Got g = Request(s, wire::Op::kPush, 1, {1, 1, 1, 1});
  EXPECT_EQ(g.status.code(), StatusCode::kFailedPrecondition) << g.status.ToString();
}

// A key declared late in the saving run is not in the map at restore time: left out.
TEST(SliceStoreCheckpointTest, KeysAbsentFromTheMapAreLeftOut) {
  auto s = UpdateStore();
  ASSERT_TRUE(s->RestoreFrom(StepFive({{7, 0, EntryKind::kValues, 5, "w", {1, 2, 3, 4}},
                                       {8, 0, EntryKind::kValues, 5, "late", {9}}}),
                             "f").ok());
  EXPECT_EQ(Request(*s, wire::Op::kPull, 0, {}).values, (std::vector<float>{1, 2, 3, 4}));
}

TEST(SliceStoreCheckpointTest, SaveWithoutAPathIsRefused) {
  StoreConfig cfg;
  SliceStore s(cfg);
  int64_t n = 0, b = 0;
  ASSERT_TRUE(s.Install(OneKeyMap(7, 4), &n, &b).ok());
  Got g = Request(s, wire::Op::kSave, 3, {}, /*key=*/0);
  EXPECT_EQ(g.status.message(), "server 0: checkpoint request but the job has no checkpoint.path");
}

}  // namespace
}  // namespace trellis
