#include "common/checkpoint/checkpoint_format.h"

#include <cstring>

#include <gtest/gtest.h>

namespace trellis {
namespace {

Checkpoint Sample() {
  Checkpoint c;
  c.step = 1234567890123;
  c.origin = "worker rank 0";
  c.entries.push_back({7, 0, EntryKind::kValues, 12, "fc1.weight", {1.5f, -2.0f, 3.25f}});
  c.entries.push_back({7, 1, EntryKind::kOptimizerM, 12, "", {0.0f}});
  c.entries.push_back({9, 0, EntryKind::kOptimizerV, 11, "empty", {}});
  // Bit patterns that arithmetic would not keep: -0, a NaN payload, a denormal.
  float nan;
  uint32_t bits = 0x7FC01234u;
  std::memcpy(&nan, &bits, 4);
  c.entries.push_back({1u << 31, 3, EntryKind::kValues, 0, "bits", {-0.0f, nan, 1e-45f}});
  return c;
}

TEST(CheckpointFormatTest, RoundTripIsBitExact) {
  const Checkpoint c = Sample();
  const std::string bytes = EncodeCheckpoint(c);
  auto back = DecodeCheckpoint(bytes, "f.ckpt");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, c.step);
  EXPECT_EQ(back->origin, c.origin);
  ASSERT_EQ(back->entries.size(), c.entries.size());
  for (size_t i = 0; i < c.entries.size(); ++i) {
    const auto& a = c.entries[i];
    const auto& b = back->entries[i];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.slice, b.slice);
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.name, b.name);
    ASSERT_EQ(a.values.size(), b.values.size());
    EXPECT_EQ(std::memcmp(a.values.data(), b.values.data(), a.values.size() * 4), 0) << i;
  }
  EXPECT_EQ(EncodeCheckpoint(*back), bytes);
}

TEST(CheckpointFormatTest, EveryTruncationIsRejectedNamingTheFile) {
  const std::string bytes = EncodeCheckpoint(Sample());
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto r = DecodeCheckpoint(std::string_view(bytes).substr(0, len), "/ckpt/model-1.ckpt");
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << len;
    EXPECT_EQ(r.status().message().rfind("/ckpt/model-1.ckpt: ", 0), 0u) << r.status().message();
  }
  auto r = DecodeCheckpoint(bytes.substr(0, bytes.size() - 3), "x");
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  r = DecodeCheckpoint(bytes + "junk", "x");
  EXPECT_EQ(r.status().message(), "x: 4 unexpected bytes after the last entry");
}

TEST(CheckpointFormatTest, EveryFlippedByteIsRejected) {
  const std::string bytes = EncodeCheckpoint(Sample());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    auto r = DecodeCheckpoint(bad, "f");
    EXPECT_FALSE(r.ok()) << "byte " << i;
  }
}

TEST(CheckpointFormatTest, MessagesSaySectionAndProblem) {
  const std::string bytes = EncodeCheckpoint(Sample());
  std::string bad = bytes;
  bad[bad.size() - 10] ^= 0x01;  // inside the last entry's data
  auto r = DecodeCheckpoint(bad, "m.ckpt");
  EXPECT_NE(r.status().message().find("m.ckpt: data checksum mismatch in entry 3 (key 2147483648 "
                                      "bits slice 3)"),
            std::string::npos)
      << r.status().message();

  bad = bytes;
  bad[0] = 'X';
  EXPECT_EQ(DecodeCheckpoint(bad, "m.ckpt").status().message(),
            "m.ckpt: not a Trellis checkpoint (bad magic)");

  bad = bytes;
  bad[8] = 2;  // version 2
  r = DecodeCheckpoint(bad, "m.ckpt");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(),
            "m.ckpt: checkpoint format version 2, this build reads version 1");

  bad = bytes;
  bad[20] ^= 0x01;  // the step, covered by the header checksum
  EXPECT_NE(DecodeCheckpoint(bad, "m.ckpt").status().message().find("header checksum mismatch"),
            std::string::npos);
}

TEST(CheckpointFormatTest, HugeCountsDoNotAllocate) {
  Checkpoint c;
  c.entries.push_back({1, 0, EntryKind::kValues, 0, "k", {1.0f}});
  std::string bytes = EncodeCheckpoint(c);
  // Claim 2^40 elements in the table and fix the table checksum: the size check must catch it.
  const size_t header = 8 + 4 + 4 + 8 + 4 + 4 + 0 + 4;
  int64_t huge = int64_t{1} << 40;
  std::memcpy(&bytes[header + 8 + 4 + 4 + 8], &huge, 8);
  auto r = DecodeCheckpoint(bytes, "h");
  ASSERT_FALSE(r.ok());
}

}  // namespace
}  // namespace trellis
