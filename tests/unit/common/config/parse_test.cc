// The one set of value parsers (common/config/parse.h): what each accepts, and errors that name
// the flag or variable and quote the value.
#include "common/config/parse.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

std::string Error(const Status& s) { return s.ok() ? "ok" : s.message(); }

TEST(ParseIntTest, WholeIntegersInRange) {
  EXPECT_EQ(*ParseInt("flag --port", "8080", 0, 65535), 8080);
  EXPECT_EQ(*ParseInt("flag --port", "+7", 0, 65535), 7);
  EXPECT_EQ(*ParseInt("flag --tcp-port", "-1", -1, 65535), -1);
  EXPECT_EQ(*ParseInt("x", "-9223372036854775808", INT64_MIN, 0), INT64_MIN);
  EXPECT_EQ(Error(ParseInt("flag --port", "http", 0, 65535).status()), "flag --port: not an integer, got 'http'");
  EXPECT_EQ(Error(ParseInt("flag --port", "", 0, 65535).status()), "flag --port: not an integer, got ''");
  EXPECT_EQ(Error(ParseInt("flag --port", " 1", 0, 65535).status()), "flag --port: not an integer, got ' 1'");
  EXPECT_EQ(Error(ParseInt("flag --port", "1e3", 0, 65535).status()), "flag --port: not an integer, got '1e3'");
  EXPECT_EQ(Error(ParseInt("flag --port", "+-1", 0, 65535).status()), "flag --port: not an integer, got '+-1'");
  EXPECT_EQ(Error(ParseInt("environment variable TRELLIS_NUM_WORKERS", "0", 1, 100000).status()),
            "environment variable TRELLIS_NUM_WORKERS: must be in 1..100000, got 0");
  EXPECT_EQ(Error(ParseInt("flag --port", "99999999999999999999", 0, 65535).status()),
            "flag --port: must be in 0..65535, got 99999999999999999999");
}

TEST(ParseBoolTest, OnOffAndTrueFalse) {
  EXPECT_TRUE(*ParseOnOff("flag --local-socket", "on"));
  EXPECT_FALSE(*ParseOnOff("flag --local-socket", "off"));
  EXPECT_EQ(Error(ParseOnOff("flag --local-socket", "yes").status()),
            "flag --local-socket: must be on or off, got 'yes'");
  EXPECT_TRUE(*ParseBool("flag --leader-elect", "true"));
  EXPECT_FALSE(*ParseBool("flag --leader-elect", "false"));
  EXPECT_EQ(Error(ParseBool("flag --leader-elect", "1").status()), "flag --leader-elect: must be true or false, got '1'");
}

TEST(ParseSecondsTest, PositiveDecimalSecondsUpToTheMaximum) {
  EXPECT_EQ(ParseSeconds("flag --heartbeat-timeout", "0.5", 86400)->count(), 500);
  EXPECT_EQ(ParseSeconds("flag --heartbeat-timeout", "30", 86400)->count(), 30000);
  for (const char* bad : {"0", "-1", "", "1s", "86401", "nan", "inf"}) {
    EXPECT_EQ(Error(ParseSeconds("flag --heartbeat-timeout", bad, 86400).status()),
              std::string("flag --heartbeat-timeout: must be seconds in (0, 86400], got '") + bad + "'");
  }
}

}  // namespace
}  // namespace trellis
