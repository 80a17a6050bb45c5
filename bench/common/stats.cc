#include "bench/common/stats.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>

namespace trellis::bench {

double Samples::Percentile(double p) const {
  if (values_.empty()) return 0;
  std::vector<double> sorted = values_;
  std::sort(sorted.begin(), sorted.end());
  p = std::clamp(p, 0.0, 100.0);
  // Nearest rank: the smallest value with at least p% of the samples at or below it.
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  if (rank == 0) rank = 1;
  return sorted[rank - 1];
}

double Samples::Mean() const {
  if (values_.empty()) return 0;
  return std::accumulate(values_.begin(), values_.end(), 0.0) / static_cast<double>(values_.size());
}

StatusOr<RunResult> RunBounded(const Budget& budget, const std::function<Status()>& iteration) {
  for (int i = 0; i < budget.warmup_iters; ++i) {
    TRELLIS_RETURN_IF_ERROR(iteration());
  }
  RunResult result;
  const Clock::time_point start = Clock::now();
  while (result.iters < budget.max_iters) {
    const Clock::time_point t0 = Clock::now();
    TRELLIS_RETURN_IF_ERROR(iteration());
    result.latencies.Add(SecondsSince(t0));
    ++result.iters;
    if (result.iters >= budget.min_iters && SecondsSince(start) >= budget.max_seconds) break;
  }
  result.seconds = SecondsSince(start);
  return result;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  std::ostringstream out;
  if (value == std::floor(value)) {
    out << static_cast<uint64_t>(value) << " " << kUnits[unit];
  } else {
    out.precision(3);
    out << value << " " << kUnits[unit];
  }
  return out.str();
}

StatusOr<uint64_t> ParseBytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos]))) ++pos;
  if (pos == 0 || pos > 15) {
    return InvalidArgumentError("bad size '" + text + "': expected a number like 4096, 4K or 16MiB");
  }
  const uint64_t number = std::stoull(text.substr(0, pos));
  std::string suffix = text.substr(pos);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  uint64_t scale = 0;
  if (suffix.empty() || suffix == "B") {
    scale = 1;
  } else if (suffix == "K" || suffix == "KIB" || suffix == "KB") {
    scale = 1ull << 10;
  } else if (suffix == "M" || suffix == "MIB" || suffix == "MB") {
    scale = 1ull << 20;
  } else if (suffix == "G" || suffix == "GIB" || suffix == "GB") {
    scale = 1ull << 30;
  } else {
    return InvalidArgumentError("bad size '" + text + "': unknown unit '" + text.substr(pos) +
                                "' (use K, M or G, binary)");
  }
  if (number == 0) return InvalidArgumentError("bad size '" + text + "': must be > 0");
  return number * scale;
}

StatusOr<std::vector<uint64_t>> ParseSizeList(const std::string& text) {
  std::vector<uint64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    TRELLIS_ASSIGN_OR_RETURN(uint64_t size, ParseBytes(item));
    sizes.push_back(size);
  }
  if (sizes.empty()) return InvalidArgumentError("empty size list '" + text + "'");
  return sizes;
}

}  // namespace trellis::bench

namespace trellis::bench {

double ProcessCpuSeconds() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double ProcessCpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 > stat.size()) return 0;
  std::istringstream fields(stat.substr(paren + 2));  // field 3 onwards
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> f; ++i) {
    if (i == 14 || i == 15) ticks += std::strtod(f.c_str(), nullptr);  // utime, stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace trellis::bench
