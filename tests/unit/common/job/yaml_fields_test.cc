// The strict field reads under the job model: types, unknown and duplicate keys, rendering.
#include "common/job/yaml_fields.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/job/yaml_emit.h"

namespace trellis::yaml {
namespace {

YAML::Node Value(const std::string& text) { return YAML::Load("v: " + text)["v"]; }

TEST(YamlFieldsTest, DescribeShowsValuesAsWritten) {
  EXPECT_EQ(Describe(Value("-2")), "-2");
  EXPECT_EQ(Describe(Value("2.5")), "2.5");
  EXPECT_EQ(Describe(Value("true")), "true");
  EXPECT_EQ(Describe(Value(".inf")), ".inf");
  EXPECT_EQ(Describe(Value("random")), "\"random\"");
  EXPECT_EQ(Describe(Value("\"2\"")), "\"2\"");  // quoted: a string, shown as one
  EXPECT_EQ(Describe(Value("~")), "null");
  EXPECT_EQ(Describe(Value("[1]")), "a sequence");
  EXPECT_EQ(Describe(Value("[]")), "an empty sequence");
  EXPECT_EQ(Describe(Value("{a: 1}")), "a mapping");
  EXPECT_EQ(Describe(Value("\"a\\\"b\\n\\u0001\"")), "\"a\\\"b\\n\\x01\"");
  EXPECT_EQ(Describe(Value(std::string(70, 'x'))), "\"" + std::string(64, 'x') + "...\"");
}

TEST(YamlFieldsTest, ScalarParsersAreStrict) {
  EXPECT_EQ(ParseInt(Value("42")), 42);
  EXPECT_EQ(ParseInt(Value("+7")), 7);
  EXPECT_EQ(ParseInt(Value("-9223372036854775808")), INT64_MIN);
  IntError err;
  EXPECT_EQ(ParseInt(Value("9223372036854775808"), &err), std::nullopt);
  EXPECT_EQ(err, IntError::kOutOfRange);
  EXPECT_EQ(ParseInt(Value("\"42\""), &err), std::nullopt);
  EXPECT_EQ(err, IntError::kNotInteger);
  EXPECT_EQ(ParseInt(Value("4.0")), std::nullopt);
  EXPECT_EQ(ParseInt(Value("0x10")), std::nullopt);
  EXPECT_EQ(ParseInt(Value("true")), std::nullopt);
  EXPECT_EQ(ParseDouble(Value("1e-8")), 1e-8);
  EXPECT_EQ(ParseDouble(Value("3")), 3.0);
  EXPECT_EQ(ParseDouble(Value(".5")), 0.5);
  EXPECT_EQ(ParseDouble(Value("-.inf")), -INFINITY);
  EXPECT_TRUE(std::isnan(*ParseDouble(Value(".nan"))));
  EXPECT_EQ(ParseDouble(Value("inf")), std::nullopt);  // strtod would take it; YAML does not
  EXPECT_EQ(ParseDouble(Value("0x1p3")), std::nullopt);
  EXPECT_EQ(ParseDouble(Value("'1.5'")), std::nullopt);
  EXPECT_EQ(ParseBool(Value("True")), true);
  EXPECT_EQ(ParseBool(Value("false")), false);
  EXPECT_EQ(ParseBool(Value("yes")), std::nullopt);
  EXPECT_EQ(ParseBool(Value("\"true\"")), std::nullopt);
}

TEST(YamlFieldsTest, MapReaderRecordsUnknownAndDuplicateKeys) {
  Errors errors;
  YAML::Node n = YAML::Load("{replicas: 1, replica: 2, replicas: 3, Args: [], status: x}");
  MapReader m(n, "spec.workers", &errors, {"replicas", "args"}, {"status"});
  EXPECT_TRUE(m.is_mapping());
  int64_t v = 0;
  EXPECT_TRUE(m.GetInt("replicas", &v));
  EXPECT_EQ(v, 1);  // the first of duplicates
  ASSERT_EQ(errors.lines().size(), 3u);
  EXPECT_EQ(errors.lines()[0], "spec.workers.replica: unknown field; did you mean \"replicas\"?");
  EXPECT_EQ(errors.lines()[1], "spec.workers.replicas: duplicate field");
  EXPECT_EQ(errors.lines()[2], "spec.workers.Args: unknown field; did you mean \"args\"?");
}

TEST(YamlFieldsTest, MapReaderTypedReads) {
  Errors errors;
  YAML::Node n = YAML::Load(
      "{s: 12, l: [a, 1], bad_l: [a, [b]], m: {k: v, e: ~}, d: 1.5, b: true, e: x, n: ~}");
  MapReader m(n, "p", &errors, {"s", "l", "bad_l", "m", "d", "b", "e", "n"});
  std::string s;
  EXPECT_TRUE(m.GetString("s", &s));
  EXPECT_EQ(s, "12");
  std::vector<std::string> l;
  EXPECT_TRUE(m.GetStringList("l", &l));
  EXPECT_EQ(l, (std::vector<std::string>{"a", "1"}));
  EXPECT_FALSE(m.GetStringList("bad_l", &l));
  std::map<std::string, std::string> kv;
  EXPECT_TRUE(m.GetStringMap("m", &kv));
  EXPECT_EQ(kv, (std::map<std::string, std::string>{{"e", ""}, {"k", "v"}}));
  double d = 0;
  EXPECT_TRUE(m.GetDouble("d", &d));
  EXPECT_EQ(d, 1.5);
  bool b = false;
  EXPECT_TRUE(m.GetBool("b", &b));
  EXPECT_TRUE(b);
  enum class E { kX, kY };
  E e = E::kY;
  EXPECT_TRUE(m.GetEnum<E>("e", {{"x", E::kX}, {"y", E::kY}}, &e));
  EXPECT_EQ(e, E::kX);
  int64_t untouched = 5;
  EXPECT_FALSE(m.GetInt("n", &untouched));        // null: unset
  EXPECT_FALSE(m.GetInt("missing", &untouched));  // absent: unset
  EXPECT_EQ(untouched, 5);
  ASSERT_EQ(errors.lines().size(), 1u);
  EXPECT_EQ(errors.lines()[0], "p.bad_l[1]: must be a string, got a sequence");
}

TEST(YamlFieldsTest, NonMappingAndNull) {
  Errors errors;
  MapReader absent(YAML::Node(), "spec.priority", &errors, {"enabled"});
  EXPECT_FALSE(absent.is_mapping());
  EXPECT_FALSE(absent.Has("enabled"));
  EXPECT_TRUE(errors.empty());
  MapReader wrong(YAML::Load("[1]"), "spec.priority", &errors, {"enabled"});
  EXPECT_EQ(errors.ToStatus().message(), "spec.priority: must be a mapping, got a sequence");
}

TEST(YamlEmitTest, KeepsQuotedStringsStrings) {
  YAML::Node n = YAML::Load(
      "{a: \"1\", b: 1, c: \"yes\", d: \"plain\", e: \"\", f: [x, \"true\"], g: ~, "
      "h: !!str 5, \"k\": v}");
  const std::string text = NodeToYaml(n);
  EXPECT_EQ(text,
            "a: \"1\"\nb: 1\nc: \"yes\"\nd: plain\ne: \"\"\nf:\n  - x\n  - \"true\"\ng: ~\n"
            "h: \"5\"\nk: v");
  // ...and it is a fixed point: printing what it reads back gives the same text.
  EXPECT_EQ(NodeToYaml(YAML::Load(text)), text);
}

TEST(YamlEmitTest, FormatDoubleRoundTrips) {
  EXPECT_EQ(FormatDouble(0.01), "0.01");
  EXPECT_EQ(FormatDouble(1e-8), "1e-08");
  EXPECT_EQ(FormatDouble(300), "300");
  EXPECT_EQ(FormatDouble(0.1 + 0.2), "0.30000000000000004");
  for (double v : {1.0 / 3, 2.0 / 3, 1e300, 5e-324, 0.999, -42.125}) {
    EXPECT_EQ(std::strtod(FormatDouble(v).c_str(), nullptr), v);
  }
}

}  // namespace
}  // namespace trellis::yaml
