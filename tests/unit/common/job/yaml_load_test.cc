// LoadFirstDocument: one document, no exceptions, and no runaway on yaml-cpp 0.7's known loop.
#include "common/job/yaml_load.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>

namespace trellis::yaml {
namespace {

TEST(YamlLoadTest, FirstDocumentAndCount) {
  int docs = -1;
  auto one = LoadFirstDocument("a: 1\n", &docs);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(docs, 1);
  EXPECT_EQ((*one)["a"].Scalar(), "1");

  auto two = LoadFirstDocument("a: 1\n---\nb: 2\n---\nc: 3\n", &docs);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(docs, 2);  // counting stops at 2
  EXPECT_EQ((*two)["a"].Scalar(), "1");

  auto none = LoadFirstDocument("# just a comment\n", &docs);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(docs, 0);
  EXPECT_FALSE(none->IsDefined());

  auto null_doc = LoadFirstDocument("~\n", &docs);
  ASSERT_TRUE(null_doc.ok());
  EXPECT_EQ(docs, 1);
  EXPECT_TRUE(null_doc->IsNull());
}

TEST(YamlLoadTest, MalformedGivesOneBasedPosition) {
  int docs = 0;
  auto bad = LoadFirstDocument("a: 1\n b: 2\n", &docs);
  EXPECT_EQ(bad.status(), InvalidArgumentError("line 2, column 3: malformed YAML: illegal map value"));
}

// Exit code 0 when "," is rejected with the expected message.
int LoadLeadingCommaUnderAMemoryCap() {
#if !defined(__SANITIZE_ADDRESS__)
  rlimit cap{512 << 20, 512 << 20};
  setrlimit(RLIMIT_AS, &cap);
#endif
  int docs = 0;
  auto r = LoadFirstDocument(",", &docs);
  const bool want =
      !r.ok() && r.status().message() == "line 1, column 1: malformed YAML: unexpected character";
  return want ? 0 : 1;
}

TEST(YamlLoadTest, LeadingCommaFailsInsteadOfExhaustingMemory) {
  // In a child with a memory cap: a regression must fail this test, not the machine.
  EXPECT_EXIT(std::_Exit(LoadLeadingCommaUnderAMemoryCap()), ::testing::ExitedWithCode(0), "");
}

// Nine levels of nine aliases each: 600 bytes that stand for 9^9 scalars once the aliases are
// expanded (the pod template's emitter and the operator's JSON conversion both expand them).
std::string AliasBomb() {
  std::string y = "spec:\n  template:\n    metadata:\n      annotations:\n";
  y += "        a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  char prev = 'a';
  for (char n = 'b'; n <= 'i'; ++n) {
    y += std::string("        ") + n + ": &" + n + " [";
    for (int k = 0; k < 9; ++k) y += std::string(k ? ", *" : "*") + prev;
    y += "]\n";
    prev = n;
  }
  return y;
}

TEST(YamlLoadTest, AliasesExpandingPastTheLimitAreRefused) {
  int docs = 0;
  auto r = LoadFirstDocument(AliasBomb(), &docs);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("with its aliases expanded it holds more than"), std::string::npos)
      << r.status().message();
  // A few aliases of a real job (a shared env list) are fine, and read as usual.
  auto ok = LoadFirstDocument("x: &e [{name: A, value: b}]\ny: *e\nz: *e\n", &docs);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)["z"][0]["value"].as<std::string>(), "b");
  // Big but honest: many distinct nodes below the limit still load.
  std::string many = "m: [";
  for (int i = 0; i < 20000; ++i) many += (i ? ",x" : "x");
  many += "]\n";
  EXPECT_TRUE(LoadFirstDocument(many, &docs).ok());
}

}  // namespace
}  // namespace trellis::yaml
