#include "common/base/edit_distance.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

TEST(EditDistanceTest, CountsEdits) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("abc", ""), 3);
  EXPECT_EQ(EditDistance("", "ab"), 2);
  EXPECT_EQ(EditDistance("replicas", "replicas"), 0);
  EXPECT_EQ(EditDistance("replica", "replicas"), 1);    // insertion
  EXPECT_EQ(EditDistance("replicass", "replicas"), 1);  // deletion
  EXPECT_EQ(EditDistance("replixas", "replicas"), 1);   // substitution
  EXPECT_EQ(EditDistance("repilcas", "replicas"), 1);   // transposition
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("ca", "abc"), 3);  // optimal string alignment, not full Damerau
}

TEST(EditDistanceTest, SuggestsTheClosestWithinTwo) {
  const std::vector<std::string_view> fields = {"replicas", "command", "args", "env"};
  EXPECT_EQ(SuggestName("replica", fields), "replicas");
  EXPECT_EQ(SuggestName("comand", fields), "command");
  EXPECT_EQ(SuggestName("REPLICAS", fields), "replicas");   // case-insensitive match
  EXPECT_EQ(SuggestName("Environment", fields), std::nullopt);
  EXPECT_EQ(SuggestName("flavour", fields), std::nullopt);
  EXPECT_EQ(SuggestName("arg", fields), "args");
  EXPECT_EQ(SuggestName("xyz", {}), std::nullopt);
  EXPECT_EQ(SuggestName("replicaaa", fields, 1), std::nullopt);
}

TEST(EditDistanceTest, CaseInsensitiveBeatsACloserEdit) {
  // "Hash" differs from "hash" by one substitution and from "Hasp" by one too; the case-only
  // difference is the likelier intent.
  EXPECT_EQ(SuggestName("Hash", {"Hasp", "hash"}), "hash");
}

}  // namespace
}  // namespace trellis
