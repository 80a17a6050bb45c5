// The JSON accessors the operator reads user objects with: nothing throws, nothing is cast out
// of range, and documents nested deeper than cpprestsdk reads still parse.
#include "operator/json_util.h"

#include <gtest/gtest.h>

namespace trellis::op {
namespace {

std::string Nested(int depth, const std::string& inner) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += R"({"a":[)";
  s += inner;
  for (int i = 0; i < depth; ++i) s += "]}";
  return s;
}

TEST(JsonUtilTest, IntRefusesWhatDoesNotFitInsteadOfCasting) {
  Json v = *ParseJson(R"({"big":1e300,"nan":-1e400,"u":18446744073709551615,"i":-7,"d":2.9,"s":"3"})");
  EXPECT_EQ(Int(v, {"big"}), std::nullopt);
  EXPECT_EQ(Int(v, {"nan"}), std::nullopt);
  EXPECT_EQ(Int(v, {"u"}), std::nullopt);
  EXPECT_EQ(Int(v, {"i"}), -7);
  EXPECT_EQ(Int(v, {"d"}), 2);
  EXPECT_EQ(Int(v, {"s"}), std::nullopt);
  EXPECT_EQ(Int(v, {"i", "x"}), std::nullopt);
}

// One TrainingJob with a pod template nested 300 levels deep (the API server stores it: the
// template preserves unknown fields) made every LIST of TrainingJobs unreadable.
TEST(JsonUtilTest, DeepDocumentsParseWithTheDeepPartMarked) {
  const std::string list = R"({"items":[{"metadata":{"name":"ok"}},{"metadata":{"name":"deep"},"spec":)" +
                           Nested(300, R"("x\"]}")") + R"(}],"metadata":{"resourceVersion":"5"}})";
  std::string error;
  auto v = ParseJson(list, &error);
  ASSERT_TRUE(v.has_value()) << error;
  EXPECT_EQ(Str(*v, {"metadata", "resourceVersion"}), "5");
  ASSERT_EQ(v->at("items").size(), 2u);
  EXPECT_EQ(FindTooDeep(v->at("items").at(0)), std::nullopt);
  auto where = FindTooDeep(v->at("items").at(1));
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->rfind("spec.a[0].a[0].", 0), 0u) << *where;
  // Shallow documents are untouched; broken ones still fail.
  EXPECT_EQ(CapJsonDepth(R"({"a":["{[\"",{"b":1}]})", 5), R"({"a":["{[\"",{"b":1}]})");
  EXPECT_EQ(CapJsonDepth(R"({"a":[1,{"b":[2]}],"c":3})", 2), R"({"a":[1,")" + std::string(kTooDeep).replace(0, 1, "\\u0001") + R"("],"c":3})");
  EXPECT_FALSE(ParseJson(Nested(300, "1") + "]").has_value());
}

TEST(JsonUtilTest, TruncateKeepsWholeCharacters) {
  EXPECT_EQ(Truncate("short", 10), "short");
  EXPECT_EQ(Truncate("abcdefghij", 8), "abcde...");
  EXPECT_EQ(Truncate("ab\xc3\xa9\xc3\xa9x", 6), "ab...");  // never half of an é
}

}  // namespace
}  // namespace trellis::op
