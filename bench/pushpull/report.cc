#include "bench/pushpull/report.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "bench/common/table.h"
#include "bench/pushpull/tls_cost.h"

namespace trellis::bench {
namespace {

std::string Us(double seconds) { return Fixed(seconds * 1e6, 0); }

// Sum over workers of one column at one size, 0 when missing.
double SumOverWorkers(const PassResult& pass, const std::string& column, uint64_t size) {
  auto c = pass.trellis.find(column);
  if (c == pass.trellis.end()) return 0;
  auto s = c->second.find(size);
  if (s == c->second.end()) return 0;
  return s->second.gbytes_per_s_per_worker * pass.workers.at(column);
}

double RatioOf(const PassResult& pass, const std::string& column, uint64_t size) {
  auto t = pass.tcp.find(size);
  return t == pass.tcp.end() || t->second <= 0 ? 0 : SumOverWorkers(pass, column, size) / t->second;
}

std::string TransportOf(const std::string& column) { return column.substr(0, column.find(' ')); }

std::vector<uint64_t> Sizes(const PassResult& pass) {
  std::vector<uint64_t> sizes;
  for (const auto& [size, gbps] : pass.tcp) sizes.push_back(size);
  return sizes;
}

// The goal cell of a goodput row: ">= 0.90 grpc MISSED tcp met", one verdict per transport,
// met when every judged column of that transport reaches the goal; "-" when none was judged.
class GoalTally {
 public:
  void Add(const std::string& column, bool reached) {
    bool& met = met_.emplace(TransportOf(column), true).first->second;
    met = met && reached;
  }
  std::string Cell(double goal) const {
    if (met_.empty()) return "-";
    std::string cell = ">= " + Fixed(goal, 2);
    for (const auto& [transport, ok] : met_) cell += " " + transport + (ok ? " met" : " MISSED");
    return cell;
  }

 private:
  std::map<std::string, bool> met_;
};

// The 4 KiB goal (idle only): p50 <= kLatencyGoalUs and <= kLatencyRatioGoal x bare gRPC unary.
std::string LatencyGoalCell(double p50_s, double unary_p50_s) {
  const double ratio = unary_p50_s > 0 ? p50_s / unary_p50_s : 0;
  const bool ok = p50_s * 1e6 <= kLatencyGoalUs && ratio <= kLatencyRatioGoal;
  return "<= " + Fixed(kLatencyGoalUs, 0) + " us and <= " + Fixed(kLatencyRatioGoal, 2) + "x " +
         (ok ? "met" : "MISSED");
}

// "0.95 (0.80-1.10)": the median (the mean of the middle two for an even count) and the range.
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread SpreadOf(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return {n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2, v.front(), v.back()};
}
std::string Format(const Spread& s, int digits) {
  return Fixed(s.median, digits) + " (" + Fixed(s.min, digits) + "-" + Fixed(s.max, digits) + ")";
}

}  // namespace

void PrintPass(const PassResult& pass, bool loaded, std::ostream& out) {
  const double goal = loaded ? kLoadedGoal : kIdleGoal;
  out << "\n== " << pass.condition << " (load average " << pass.load_average_start << " at the start, "
      << Fixed(pass.seconds, 1) << " s)\n\nGoodput (GB/s = 1e9 bytes/s; tensor size counted once per "
      << "direction; Trellis: the sum over workers):\n\n";
  std::vector<std::string> header = {"size", pass.trellis.empty() ? "TCP echo" : "TCP echo (mean of 2)",
                                     "gRPC stream"};
  for (const std::string& name : pass.columns) {
    header.push_back("Trellis " + name);
    header.push_back("/ TCP");
  }
  header.push_back("goal");
  Table goodput(header);
  for (uint64_t size : Sizes(pass)) {
    auto stream = pass.stream.find(size);
    std::vector<std::string> row = {FormatBytes(size), Fixed(pass.tcp.at(size), 2),
                                    stream == pass.stream.end() ? "-" : Fixed(stream->second.gbytes_per_s, 2)};
    GoalTally tally;
    for (const std::string& name : pass.columns) {
      const double ratio = RatioOf(pass, name, size);
      row.push_back(Fixed(SumOverWorkers(pass, name, size), 2));
      row.push_back(Fixed(ratio, 2));
      // The goals are the plain data path's (TLS has its table), from kGoalFrom up.
      if (size >= kGoalFrom && !IsTlsColumn(name)) tally.Add(name, ratio >= goal);
    }
    row.push_back(tally.Cell(goal));
    goodput.AddRow(row);
  }
  goodput.Print(out);

  if (!pass.columns.empty()) {
    // Where cores are scarce, goodput follows CPU per byte; timing noise does not move this much.
    out << "\nCPU per MiB moved (ms; user + system of the bench and the servers; the echo's three "
           "threads):\n\n";
    std::vector<std::string> cpu_header = {"size", "TCP echo"};
    for (const std::string& name : pass.columns) {
      cpu_header.push_back("Trellis " + name);
      cpu_header.push_back("/ TCP");
    }
    Table cpu(cpu_header);
    for (uint64_t size : Sizes(pass)) {
      const double mib = static_cast<double>(size) / (1 << 20);
      const double echo = pass.tcp_cpu_s.count(size) ? pass.tcp_cpu_s.at(size) * 1e3 / mib : 0;
      std::vector<std::string> row = {FormatBytes(size), Fixed(echo, 3)};
      for (const std::string& name : pass.columns) {
        auto c = pass.trellis.at(name).find(size);
        // Per worker step; W workers each move `size`, so per MiB divide by W as well.
        const double t = c == pass.trellis.at(name).end()
                             ? 0
                             : c->second.cpu_s_per_step * 1e3 / mib / pass.workers.at(name);
        row.push_back(Fixed(t, 3));
        row.push_back(echo > 0 ? Fixed(t / echo, 2) : "-");
      }
      cpu.AddRow(row);
    }
    cpu.Print(out);
  }

  out << "\n4 KiB round trip (microseconds):\n\n";
  Table latency({"", "p50", "p99", "p50 / gRPC unary", "goal"});
  latency.AddRow({"bare gRPC unary", Us(pass.unary.p50_s), Us(pass.unary.p99_s), "1.00", ""});
  for (const auto& [transport, lat] : pass.latency) {
    const double ratio = pass.unary.p50_s > 0 ? lat.p50_s / pass.unary.p50_s : 0;
    latency.AddRow({"Trellis PushPull " + transport + " (first topology)", Us(lat.p50_s), Us(lat.p99_s),
                    Fixed(ratio, 2), loaded ? "-" : LatencyGoalCell(lat.p50_s, pass.unary.p50_s)});
  }
  latency.Print(out);
  if (!pass.tls_offload.empty()) PrintTlsCost(pass, out);
}

void PrintComparison(const PassResult& idle, const PassResult& loaded, std::ostream& out) {
  out << "\nWithout and with the load: Trellis (sum over workers) / TCP echo of the same pass "
         "(goals >= " << Fixed(kIdleGoal, 2) << " idle, >= " << Fixed(kLoadedGoal, 2) << " loaded, from "
      << FormatBytes(kGoalFrom) << "):\n\n";
  std::vector<std::string> columns;  // those measured in both passes
  std::set<std::string> in_loaded(loaded.columns.begin(), loaded.columns.end());
  for (const std::string& c : idle.columns) {
    if (in_loaded.count(c)) columns.push_back(c);
  }
  std::vector<std::string> header = {"size", "TCP echo idle", "TCP echo load"};
  for (const std::string& c : columns) {
    header.push_back(c + " idle");
    header.push_back(c + " load");
  }
  Table table(header);
  for (uint64_t size : Sizes(idle)) {
    if (!loaded.tcp.count(size)) continue;
    std::vector<std::string> row = {FormatBytes(size), Fixed(idle.tcp.at(size), 2), Fixed(loaded.tcp.at(size), 2)};
    for (const std::string& c : columns) {
      const double a = RatioOf(idle, c, size), b = RatioOf(loaded, c, size);
      const bool judged = size >= kGoalFrom;
      row.push_back(Fixed(a, 2) + (judged && a < kIdleGoal ? " !" : ""));
      row.push_back(Fixed(b, 2) + (judged && b < kLoadedGoal ? " !" : ""));
    }
    table.AddRow(row);
  }
  table.Print(out);
  out << "(! = below its goal)\n";
  Table latency({"4 KiB p50 (us)", "idle", "load"});
  latency.AddRow({"bare gRPC unary", Us(idle.unary.p50_s), Us(loaded.unary.p50_s)});
  for (const auto& [transport, lat] : idle.latency) {
    auto l = loaded.latency.find(transport);
    latency.AddRow({"Trellis " + transport, Us(lat.p50_s), l == loaded.latency.end() ? "-" : Us(l->second.p50_s)});
  }
  out << "\n";
  latency.Print(out);
}

void PrintRounds(const std::vector<PassResult>& passes, bool loaded, std::ostream& out) {
  if (passes.empty()) return;
  const PassResult& first = passes.front();
  const double goal = loaded ? kLoadedGoal : kIdleGoal;
  out << "\n== " << first.condition << ", " << passes.size()
      << " rounds: Trellis (sum over workers) / TCP echo of the same pass, median (min-max); the "
         "goal is judged on the median\n\n";
  std::vector<std::string> header = {"size", "TCP echo GB/s"};
  for (const std::string& name : first.columns) header.push_back(name);
  header.push_back("goal");
  Table goodput(header);
  for (uint64_t size : Sizes(first)) {
    std::vector<double> echo;
    for (const PassResult& p : passes) {
      if (auto t = p.tcp.find(size); t != p.tcp.end()) echo.push_back(t->second);
    }
    std::vector<std::string> row = {FormatBytes(size), Format(SpreadOf(echo), 2)};
    GoalTally tally;
    for (const std::string& name : first.columns) {
      std::vector<double> ratios;
      for (const PassResult& p : passes) ratios.push_back(RatioOf(p, name, size));
      const Spread r = SpreadOf(ratios);
      const bool judged = size >= kGoalFrom && !IsTlsColumn(name);
      row.push_back(Format(r, 2) + (judged && r.median < goal ? " !" : ""));
      if (judged) tally.Add(name, r.median >= goal);
    }
    row.push_back(tally.Cell(goal));
    goodput.AddRow(row);
  }
  goodput.Print(out);
  out << "(! = median below its goal)\n\n4 KiB round trip p50 (microseconds), median (min-max):\n\n";
  Table latency({"", "p50", "goal"});
  std::vector<double> unary;
  for (const PassResult& p : passes) unary.push_back(p.unary.p50_s * 1e6);
  const Spread unary_p50 = SpreadOf(unary);
  latency.AddRow({"bare gRPC unary", Format(unary_p50, 0), ""});
  for (const auto& [transport, lat] : first.latency) {
    std::vector<double> p50;
    for (const PassResult& p : passes) {
      if (auto l = p.latency.find(transport); l != p.latency.end()) p50.push_back(l->second.p50_s * 1e6);
    }
    const Spread s = SpreadOf(p50);
    latency.AddRow({"Trellis PushPull " + transport + " (first topology)", Format(s, 0),
                    loaded ? "-" : LatencyGoalCell(s.median * 1e-6, unary_p50.median * 1e-6)});
  }
  latency.Print(out);
}

}  // namespace trellis::bench
