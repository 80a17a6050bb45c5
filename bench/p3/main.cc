// bench_p3: training-step simulator for P3 (priority-based parameter propagation).
//
// 2 workers x 2 servers, each on its own test host with a rate-limited link
// (bench/common/testhosts.sh: network namespaces, veth, tc tbf; needs root). Each worker runs
// forward and backward passes that sleep per layer (bench/p3/models.cc) and exchanges the real
// gradient sizes through trellis-pserver processes, in three schedules:
//   (a) whole tensors (one slice per key), FIFO, no overlap;
//   (b) whole tensors, FIFO, each layer pushed as soon as its gradient exists;
//   (c) Trellis P3: slices of --slice-bytes, priority -layer, each layer waited for just before
//       its forward.
// It prints the mean step time of each and the speed-up of (c) over (a), next to the P3 paper's
// figures. Compute is dilated (--dilation D): at link rate R that simulates a link of D*R with
// the real compute times, so a 1gbit test link stands for 10 Gbit/s.
//
//   sudo build/bin/bench_p3 [--models resnet50,vgg19,transformer] [--rate 1gbit] [--dilation 10]
//        [--steps 2] [--warmup 1] [--slice-bytes 256Ki] [--water-mark 8] [--bulking true]
//        [--schedules a,b,c] [--prefix tb4] [--log-dir DIR] [--deadline 600] [--case-deadline 240]
// (a) and (b) never bulk (whole tensors); --slice-bytes, --water-mark and --bulking apply to (c).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <thread>

#include "bench/common/stats.h"
#include "bench/common/table.h"
#include "bench/p3/models.h"
#include "bench/p3/netns_job.h"
#include "bench/p3/simulate.h"
#include "common/config/env.h"
#include "common/process/subprocess.h"
#include "trellis/trellis.h"

namespace trellis::bench {
namespace {

struct Flags {
  std::map<std::string, std::string> values;
  std::string Get(const std::string& k, const std::string& def) const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second;
  }
};

StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) return InvalidArgumentError("unexpected argument '" + a + "'");
    a = a.substr(2);
    if (auto eq = a.find('='); eq != std::string::npos) {
      f.values[a.substr(0, eq)] = a.substr(eq + 1);
    } else if (a == "simulate" || a == "help") {
      f.values[a] = "1";
    } else if (i + 1 < argc) {
      f.values[a] = argv[++i];
    } else {
      return InvalidArgumentError("flag --" + a + " needs a value");
    }
  }
  return f;
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Worker side: run inside the job by the agent.
int SimulateMain(const Flags& f) {
  auto model = ModelByName(f.Get("model", "resnet50"));
  auto schedule = ScheduleByName(f.Get("schedule", "c"));
  if (!model.ok() || !schedule.ok()) {
    std::cerr << (model.ok() ? schedule.status() : model.status()).ToString() << "\n";
    return 2;
  }
  SimulateOptions o;
  o.schedule = *schedule;
  o.steps = std::atoi(f.Get("steps", "2").c_str());
  o.warmup_steps = std::atoi(f.Get("warmup", "1").c_str());
  o.dilation = std::atof(f.Get("dilation", "1").c_str());
  if (o.steps < 1 || o.warmup_steps < 0 || o.dilation <= 0) {
    std::cerr << "bad --steps, --warmup or --dilation\n";
    return 2;
  }
  auto worker = Worker::Create();
  if (!worker.ok()) {
    std::cerr << "bench_p3 worker: " << worker.status().ToString() << "\n";
    return 1;
  }
  auto step = SimulateTraining(**worker, *model, o);
  if (!step.ok()) {
    std::cerr << "bench_p3 worker " << (*worker)->rank() << ": " << step.status().ToString()
              << "\n";
    return 1;
  }
  const std::string path =
      f.Get("result-dir", ".") + "/worker-" + std::to_string((*worker)->rank()) + ".txt";
  std::ofstream out(path, std::ios::trunc);
  out << *step << "\n";
  std::cout << "worker " << (*worker)->rank() << ": " << *step << " s/step\n";
  return out ? 0 : 1;
}

std::string g_testhosts;  // the script, for the signal thread
std::string g_prefix;

int Hosts(const std::string& verb, const std::string& extra) {
  std::string cmd = g_testhosts + " " + verb + " --prefix " + g_prefix + " " + extra;
  return std::system(cmd.c_str());
}

struct Goal {
  const char* model;
  double speedup;  // P3 paper: step rate of P3 over the MXNet baseline
};
constexpr Goal kGoals[] = {{"resnet50", 1.25}, {"vgg19", 1.66}, {"transformer", 1.38}};

// The whole bench ends by --deadline (seconds, default 600): a case gets what is left, at most
// --case-deadline (default 240).
StatusOr<double> RunCase(const Flags& f, const std::string& bin_dir, const std::string& log_dir,
                         const std::string& model, const std::string& schedule,
                         std::chrono::steady_clock::time_point bench_deadline) {
  const std::string name = "p3-" + model + "-" + schedule;
  const std::string run_dir = log_dir + "/" + name;
  std::system(("rm -rf '" + run_dir + "' && mkdir -p '" + run_dir + "'").c_str());
  const bool p3 = schedule == "c";
  const std::string job_file = run_dir + "/job.yaml";
  {
    std::ofstream job(job_file, std::ios::trunc);
    job << "apiVersion: trellis.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: " << name
        << "\nspec:\n  servers:\n    replicas: 2\n  workers:\n    replicas: 2\n"
        << "    command: [" << bin_dir << "/bench_p3, --simulate, --model, " << model
        << ", --schedule, " << schedule << ", --steps, " << f.Get("steps", "2")
        << ", --warmup, " << f.Get("warmup", "1") << ", --dilation, " << f.Get("dilation", "10")
        << ", --result-dir, " << run_dir << "]\n"
        << "  transport: tcp\n"
        // Whole tensors: one slice per key (the largest, VGG-19's fc6, is 392 MiB).
        << "  sliceBytes: " << (p3 ? f.Get("slice-bytes", "256Ki") : std::string("1Gi")) << "\n"
        << "  priority:\n    enabled: " << (p3 ? "true" : "false")
        << "\n    waterMark: " << f.Get("water-mark", "8") << "\n"
        << "  bulking:\n    enabled: " << (p3 ? f.Get("bulking", "true") : "false") << "\n";
    if (!job) return UnavailableError("cannot write " + job_file);
  }
  NetnsJobOptions o;
  o.prefix = g_prefix;
  o.bin_dir = bin_dir;
  o.run_dir = run_dir;
  o.job_file = job_file;
  const auto left = std::chrono::duration_cast<std::chrono::seconds>(
      bench_deadline - std::chrono::steady_clock::now());
  o.deadline = std::min(std::chrono::seconds(std::atoi(f.Get("case-deadline", "240").c_str())), left);
  if (o.deadline.count() <= 0) {
    return DeadlineExceededError(name + ": skipped, the bench's --deadline has passed");
  }
  TRELLIS_RETURN_IF_ERROR(RunNetnsJob(o).Annotate(name));
  double sum = 0;
  for (int w = 0; w < 2; ++w) {
    std::ifstream in(run_dir + "/worker-" + std::to_string(w) + ".txt");
    double s = 0;
    if (!(in >> s) || s <= 0) return DataLossError(name + ": worker " + std::to_string(w) + " left no result");
    sum += s;
  }
  return sum / 2;
}

int Main(int argc, char** argv) {
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::cerr << "bench_p3: " << flags.status().message() << "\n";
    return 2;
  }
  const Flags& f = *flags;
  if (f.values.count("simulate")) return SimulateMain(f);
  if (f.values.count("help")) {
    std::cout << "see the header of bench/p3/main.cc\n";
    return 0;
  }
  auto self_dir = SelfExeDir();
  if (!self_dir.ok()) {
    std::cerr << "bench_p3: " << self_dir.status().ToString() << "\n";
    return 1;
  }
  const std::string bin_dir = *self_dir;
  g_testhosts = std::string(TRELLIS_SOURCE_DIR) + "/bench/common/testhosts.sh";
  g_prefix = f.Get("prefix", "tb4");
  const std::string rate = f.Get("rate", "1gbit");
  const double dilation = std::atof(f.Get("dilation", "10").c_str());
  const std::string log_dir = f.Get("log-dir", "/tmp/bench_p3-" + std::to_string(getuid()));
  std::system(("mkdir -p '" + log_dir + "'").c_str());

  if (Hosts("check", "> /dev/null 2>&1") != 0) {
    std::cout << "bench_p3: network namespaces or tc are not available here (needs root); "
                 "nothing measured\n";
    return 0;
  }
  // SIGINT/SIGTERM: take the test hosts down (which ends every process in them), then exit.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::thread([sigs] {
    int sig = 0;
    if (sigwait(&sigs, &sig) == 0) {
      Hosts("down", "");
      std::_Exit(128 + sig);
    }
  }).detach();

  if (Hosts("up", "--hosts 4 --rate " + rate + " > " + log_dir + "/testhosts.log 2>&1") != 0) {
    std::cerr << "bench_p3: testhosts.sh up failed (see " << log_dir << "/testhosts.log)\n";
    Hosts("down", "> /dev/null 2>&1");
    return 1;
  }
  std::cout << "bench_p3: 2 workers x 2 servers, one test host each, links of " << rate
            << " (tc tbf in network namespaces); compute dilated x" << dilation
            << ", so this stands for " << dilation << " x " << rate
            << " with the models' real compute times\n";
  Table table({"model", "params", "compute/step", "link, dilation", "(a) s/step", "(b) s/step",
               "(c) s/step", "c/a speed-up", "goal", "met"});
  int status = 0;
  const auto schedules = Split(f.Get("schedules", "a,b,c"));
  const auto bench_deadline = std::chrono::steady_clock::now() +
                              std::chrono::seconds(std::atoi(f.Get("deadline", "600").c_str()));
  for (const std::string& name : Split(f.Get("models", "resnet50,vgg19,transformer"))) {
    auto model = ModelByName(name);
    if (!model.ok()) {
      std::cerr << "bench_p3: " << model.status().message() << "\n";
      status = 2;
      break;
    }
    std::map<std::string, double> step;
    for (const std::string& s : schedules) {
      auto r = RunCase(f, bin_dir, log_dir, name, s, bench_deadline);
      if (!r.ok()) {
        std::cerr << "bench_p3: " << r.status().ToString() << "\n";
        status = 1;
        continue;
      }
      step[s] = *r;
      std::cout << "  " << name << " (" << s << "): " << Fixed(*r, 3) << " s/step\n" << std::flush;
    }
    double goal = 0;
    for (const Goal& g : kGoals) {
      if (name == g.model) goal = g.speedup;
    }
    auto cell = [&](const std::string& s) { return step.count(s) ? Fixed(step[s], 3) : "-"; };
    std::string speedup = "-", met = "-";
    if (step.count("a") && step.count("c")) {
      const double x = step["a"] / step["c"];
      speedup = Fixed(x, 2) + "x";
      met = x >= goal ? "yes" : "no";
    }
    table.AddRow({name, Fixed(static_cast<double>(model->parameters()) / 1e6, 1) + "M",
                  Fixed(model->compute_s() * 1e3, 0) + " ms",
                  rate + " x" + Fixed(dilation, 0) + " compute",
                  cell("a"), cell("b"), cell("c"), speedup,
                  ">= " + Fixed(goal, 2) + "x", met});
  }
  Hosts("down", "> /dev/null 2>&1");
  table.Print(std::cout);
  std::cout << "(step time: mean over " << f.Get("steps", "2") << " steps after "
            << f.Get("warmup", "1") << " warm-up, both workers; logs in " << log_dir << ")\n";
  return status;
}

}  // namespace
}  // namespace trellis::bench

int main(int argc, char** argv) { return trellis::bench::Main(argc, argv); }
