// netns_job_run: runs one TrainingJob across the test hosts that bench/common/testhosts.sh
// brought up (RunNetnsJob: scheduler and server 0 on host 0, server i on host i, worker i on host
// S+i). For benchmarks written in another language (bench/pytorch/bench_models.py); exit 0 when
// every worker exited 0, else 1 with the failure on stderr.
//
//   netns_job_run --prefix tm --job job.yaml --run-dir DIR [--deadline 300]
#include <cstdlib>
#include <iostream>
#include <string>

#include "bench/p3/netns_job.h"
#include "common/process/subprocess.h"

int main(int argc, char** argv) {
  trellis::bench::NetnsJobOptions o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--prefix") {
      o.prefix = value;
    } else if (flag == "--job") {
      o.job_file = value;
    } else if (flag == "--run-dir") {
      o.run_dir = value;
    } else if (flag == "--deadline") {
      o.deadline = std::chrono::seconds(std::atoi(value.c_str()));
    } else {
      std::cerr << "netns_job_run: unknown flag " << flag << "\n";
      return 2;
    }
  }
  if (argc % 2 != 1 || o.prefix.empty() || o.job_file.empty() || o.run_dir.empty() ||
      o.deadline.count() <= 0) {
    std::cerr << "usage: netns_job_run --prefix P --job FILE --run-dir DIR [--deadline S]\n";
    return 2;
  }
  auto self_dir = trellis::SelfExeDir();
  if (!self_dir.ok()) {
    std::cerr << "netns_job_run: " << self_dir.status().ToString() << "\n";
    return 1;
  }
  o.bin_dir = *self_dir;
  if (auto s = trellis::bench::RunNetnsJob(o); !s.ok()) {
    std::cerr << "netns_job_run: " << s.ToString() << "\n";
    return 1;
  }
  return 0;
}
