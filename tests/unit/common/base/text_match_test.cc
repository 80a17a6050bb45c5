// The lexical checks of untrusted job text: the same answers as the patterns they replace (on
// short random strings, against std::regex), and no crash or slowness on megabytes.
#include "common/base/text_match.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <regex>
#include <string>

namespace trellis::text {
namespace {

TEST(TextMatchTest, AgreesWithTheRegularExpressionsOnShortStrings) {
  const std::regex label("[a-z0-9]([-a-z0-9]*[a-z0-9])?");
  const std::regex subdomain("[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*");
  const std::regex integer("[-+]?[0-9]+");
  const std::regex real(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  const std::regex quantity(
      R"(\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?)");
  const std::string alphabet = "az09-.+eEikMGn_ ";
  std::mt19937 rng(7);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int n = 0;
  for (; n < 200000 && std::chrono::steady_clock::now() < until; ++n) {
    std::string s(rng() % 9, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    ASSERT_EQ(IsDns1123Label(s), std::regex_match(s, label)) << '"' << s << '"';
    ASSERT_EQ(IsDns1123Subdomain(s), std::regex_match(s, subdomain)) << '"' << s << '"';
    ASSERT_EQ(IsIntText(s), std::regex_match(s, integer)) << '"' << s << '"';
    ASSERT_EQ(IsFloatText(s), std::regex_match(s, real)) << '"' << s << '"';
    ASSERT_EQ(IsQuantity(s), std::regex_match(s, quantity)) << '"' << s << '"';
  }
  EXPECT_GT(n, 1000);
  for (const char* q : {"2", "500m", "1.5", "4Gi", "1e3", "128M", ".5", "+1Ki"}) EXPECT_TRUE(IsQuantity(q)) << q;
  for (const char* q : {"", "1Gb", "-1", "1.5.5", "e3", "1ki"}) EXPECT_FALSE(IsQuantity(q)) << q;
}

TEST(TextMatchTest, MegabytesAreAnsweredAtOnce) {
  const std::string digits(8 << 20, '7');
  const std::string letters(8 << 20, 'a');
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(IsIntText(digits));
  EXPECT_TRUE(IsFloatText(digits));
  EXPECT_TRUE(IsQuantity(digits));
  EXPECT_FALSE(IsDns1123Label(letters));      // longer than 63
  EXPECT_FALSE(IsDns1123Subdomain(letters));  // longer than 253
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

}  // namespace
}  // namespace trellis::text
