// bench_pushpull: Trellis PushPull goodput and latency next to physical baselines measured in
// the same run, optionally a second time under a competing CPU load (--load). See
// docs/performance.md for how to read the tables; `--help` for the flags.
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "bench/common/table.h"
#include "bench/pushpull/cpu_load.h"
#include "bench/pushpull/flags.h"
#include "bench/pushpull/pass.h"
#include "bench/pushpull/report.h"
#include "common/logging.h"

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
  StatusOr<PassResult> idle = RunPass(flags, "idle", *bin_dir, *log_dir + "/idle");
  if (!idle.ok()) {
    std::cerr << "bench_pushpull: " << idle.status().ToString() << "\n";
    return 1;
  }
  StatusOr<PassResult> loaded = InvalidArgumentError("no loaded pass");
  if (load != nullptr) {
    const std::string condition = "load: " + std::to_string(load->processes()) + " busy processes";
    Status resumed = load->Resume();
    loaded = resumed.ok() ? RunPass(flags, condition, *bin_dir, *log_dir + "/load") : resumed;
    Status paused = load->Pause();
    if (!loaded.ok() || !paused.ok()) {
      std::cerr << "bench_pushpull: " << (loaded.ok() ? paused : loaded.status()).ToString() << "\n";
      return 1;
    }
  }
  PrintPass(*idle, /*loaded=*/false, std::cout);
  if (loaded.ok()) {
    PrintPass(*loaded, /*loaded=*/true, std::cout);
    PrintComparison(*idle, *loaded, std::cout);
  }
  std::cout << "\ntotal bench time " << Fixed(SecondsSince(bench_start), 1) << " s, load average "
            << LoadAverage() << "\n";
  return idle->trellis_failed || (loaded.ok() && loaded->trellis_failed) ? 1 : 0;
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
