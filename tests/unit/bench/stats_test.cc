#include "bench/common/stats.h"

#include <gtest/gtest.h>

#include <sstream>

#include "bench/common/table.h"

namespace trellis::bench {
namespace {

TEST(BenchParseBytes, AcceptsBinaryUnits) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("4K"), 4096u);
  EXPECT_EQ(*ParseBytes("4KiB"), 4096u);
  EXPECT_EQ(*ParseBytes("16m"), 16u << 20);
  EXPECT_EQ(*ParseBytes("1G"), 1u << 30);
}

TEST(BenchParseBytes, RejectsGarbageWithAClearMessage) {
  StatusOr<uint64_t> r = ParseBytes("4X");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'4X'"), std::string::npos) << r.status().message();
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("M").ok());
  EXPECT_FALSE(ParseBytes("0").ok());
  EXPECT_FALSE(ParseBytes("-4K").ok());
  EXPECT_FALSE(ParseBytes("99999999999999999999").ok());
}

TEST(BenchParseSizeList, SplitsOnCommas) {
  StatusOr<std::vector<uint64_t>> r = ParseSizeList("4K,1M,,64M");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (std::vector<uint64_t>{4096, 1u << 20, 64u << 20}));
  EXPECT_FALSE(ParseSizeList(",").ok());
  EXPECT_FALSE(ParseSizeList("4K,bad").ok());
}

TEST(BenchFormatBytes, UsesTheLargestWholeUnit) {
  EXPECT_EQ(FormatBytes(4096), "4 KiB");
  EXPECT_EQ(FormatBytes(64u << 20), "64 MiB");
  EXPECT_EQ(FormatBytes(1000), "1000 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
}

TEST(BenchSamples, NearestRankPercentiles) {
  Samples s;
  EXPECT_EQ(s.Percentile(50), 0);
  for (int i = 100; i >= 1; --i) s.Add(i);
  EXPECT_EQ(s.Percentile(50), 50);
  EXPECT_EQ(s.Percentile(99), 99);
  EXPECT_EQ(s.Percentile(100), 100);
  EXPECT_EQ(s.Percentile(0), 1);
  EXPECT_DOUBLE_EQ(s.Mean(), 50.5);
}

TEST(BenchRunBounded, HonoursIterationBoundsAndWarmup) {
  int calls = 0;
  Budget b{.warmup_iters = 2, .min_iters = 5, .max_iters = 5, .max_seconds = 100};
  StatusOr<RunResult> r = RunBounded(b, [&] {
    ++calls;
    return Status::Ok();
  });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->iters, 5);
  EXPECT_EQ(r->latencies.count(), 5u);
  EXPECT_EQ(calls, 7);
}

TEST(BenchRunBounded, StopsAfterMinItersOnceTimeIsUp) {
  Budget b{.warmup_iters = 0, .min_iters = 3, .max_iters = 1000000, .max_seconds = 0};
  StatusOr<RunResult> r = RunBounded(b, [] { return Status::Ok(); });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->iters, 3);
}

TEST(BenchRunBounded, ReturnsTheFirstError) {
  int calls = 0;
  StatusOr<RunResult> r = RunBounded(Budget{}, [&] {
    return ++calls == 3 ? InternalError("boom") : Status::Ok();
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "boom");
  EXPECT_EQ(calls, 3);
}

TEST(BenchTable, PadsColumnsAndShortRows) {
  Table t({"size", "GB/s"});
  t.AddRow({"64 MiB", "1.5"});
  t.AddRow({"4 KiB"});
  std::ostringstream out;
  t.Print(out);
  EXPECT_EQ(out.str(),
            "| size   | GB/s |\n"
            "|--------|------|\n"
            "| 64 MiB | 1.5  |\n"
            "| 4 KiB  |      |\n");
  EXPECT_EQ(Fixed(0.7812, 2), "0.78");
}

}  // namespace
}  // namespace trellis::bench
