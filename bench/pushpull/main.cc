// bench_pushpull: Trellis PushPull goodput and latency next to physical baselines measured in
// the same run, optionally a second time under a competing CPU load (--load). See
// docs/performance.md for how to read the tables; `--help` for the flags.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/common/table.h"
#include "bench/pushpull/cpu_load.h"
#include "bench/pushpull/flags.h"
#include "bench/pushpull/pass.h"
#include "bench/pushpull/report.h"
#include "common/base/logging.h"

namespace trellis::bench {
namespace {

StatusOr<std::string> BinDir(const Flags& flags) {
  if (!flags.bin_dir.empty()) return flags.bin_dir;
  std::error_code ec;
  std::string dir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
  if (ec) return UnavailableError("cannot read /proc/self/exe: " + ec.message());
  return dir;
}

StatusOr<std::string> LogDir(const Flags& flags) {
  std::string dir = flags.log_dir;
  if (dir.empty()) {
    char tmpl[] = "/tmp/bench_pushpull.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return UnavailableError(std::string("mkdtemp: ") + std::strerror(errno));
    dir = tmpl;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create log dir " + dir + ": " + ec.message());
  return dir;
}

// `load` is null without --load. Each pass keeps its children's logs in its own folder.
int Run(const Flags& flags, CpuLoad* load) {
  const auto bench_start = Clock::now();
  std::cout << "bench_pushpull: " << (flags.quick ? "quick" : "full") << " run, "
            << std::thread::hardware_concurrency() << " CPUs, loopback, load average " << LoadAverage()
            << (load ? ", then again with " + std::to_string(load->processes()) + " busy processes" : "")
            << "\n";
  StatusOr<std::string> bin_dir = BinDir(flags);
  StatusOr<std::string> log_dir = bin_dir.ok() ? LogDir(flags) : bin_dir.status();
  if (!log_dir.ok()) {
    std::cerr << "bench_pushpull: " << log_dir.status().ToString() << "\n";
    return 1;
  }
  if (!flags.baselines_only && TrellisAvailable()) {
    std::cout << "  trellis: binaries from " << *bin_dir << ", logs in " << *log_dir << "\n";
  }
  // Round r: idle, then loaded, so a load that drifts during the bench hits both alike.
  std::vector<PassResult> idle, loaded;
  for (int r = 1; r <= flags.rounds; ++r) {
    const std::string round = flags.rounds > 1 ? "/round" + std::to_string(r) : "";
    if (flags.rounds > 1) std::cout << "round " << r << " of " << flags.rounds << "\n";
    StatusOr<PassResult> pass = RunPass(flags, "idle", *bin_dir, *log_dir + "/idle" + round);
    if (!pass.ok()) {
      std::cerr << "bench_pushpull: " << pass.status().ToString() << "\n";
      return 1;
    }
    idle.push_back(std::move(*pass));
    if (load == nullptr) continue;
    const std::string condition = "load: " + std::to_string(load->processes()) + " busy processes";
    Status resumed = load->Resume();
    pass = resumed.ok() ? RunPass(flags, condition, *bin_dir, *log_dir + "/load" + round) : resumed;
    Status paused = load->Pause();
    if (!pass.ok() || !paused.ok()) {
      std::cerr << "bench_pushpull: " << (pass.ok() ? paused : pass.status()).ToString() << "\n";
      return 1;
    }
    loaded.push_back(std::move(*pass));
  }
  if (flags.rounds == 1) {
    PrintPass(idle.front(), /*loaded=*/false, std::cout);
    if (!loaded.empty()) {
      PrintPass(loaded.front(), /*loaded=*/true, std::cout);
      PrintComparison(idle.front(), loaded.front(), std::cout);
    }
  } else {
    PrintRounds(idle, /*loaded=*/false, std::cout);
    PrintRounds(loaded, /*loaded=*/true, std::cout);
  }
  std::cout << "\ntotal bench time " << Fixed(SecondsSince(bench_start), 1) << " s, load average "
            << LoadAverage() << "\n";
  const auto failed = [](const PassResult& p) { return p.trellis_failed; };
  return std::any_of(idle.begin(), idle.end(), failed) || std::any_of(loaded.begin(), loaded.end(), failed)
             ? 1
             : 0;
}

}  // namespace
}  // namespace trellis::bench

int main(int argc, char** argv) {
  trellis::SetLogTag("bench_pushpull");
  trellis::SetLogLevel(trellis::LogLevel::kWarning);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << trellis::bench::kUsage;
      return 0;
    }
  }
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  trellis::StatusOr<trellis::bench::Flags> flags = trellis::bench::ParseFlags(argc, argv, cpus);
  if (!flags.ok()) {
    std::cerr << "bench_pushpull: " << flags.status().message() << "\n" << trellis::bench::kUsage;
    return 2;
  }
  // The load's processes are forked first, while this process has a single thread.
  std::unique_ptr<trellis::bench::CpuLoad> load;
  if (flags->load_processes > 0) {
    auto started = trellis::bench::CpuLoad::Start(flags->load_processes);
    if (!started.ok()) {
      std::cerr << "bench_pushpull: --load: " << started.status().ToString() << "\n";
      return 1;
    }
    load = std::move(*started);
  }
  return trellis::bench::Run(*flags, load.get());
}
