#include "launcher/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/process/exit_codes.h"
#include "common/tls/auth.h"
#include "common/config/env.h"
#include "common/base/file_util.h"
#include "common/base/random_token.h"
#include "common/tls/tls_gen.h"
#include "common/base/net.h"
#include "launcher/resize_command.h"

namespace trellis {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string Seconds(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

Status WriteSecretFile(const std::string& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return InternalError("cannot create " + path + ": " + strerror(errno));
  ::fchmod(fd, 0600);  // an existing file (reused --log-dir) keeps its mode otherwise
  ssize_t n = ::write(fd, content.data(), content.size());
  ::close(fd);
  if (n != static_cast<ssize_t>(content.size())) return InternalError("cannot write " + path);
  return Status::Ok();
}

std::string_view KindName(ProcessPlan::Kind k) {
  switch (k) {
    case ProcessPlan::Kind::kScheduler: return "scheduler";
    case ProcessPlan::Kind::kServer: return "server";
    case ProcessPlan::Kind::kWorker: return "worker";
  }
  return "process";
}

// The view's entry for worker `slot` lost for good (elastic jobs), or nullptr.
const v1::LostWorker* LostEntry(const v1::ClusterView& view, int slot) {
  for (const auto& l : view.lost_workers()) {
    if (l.slot() == slot) return &l;
  }
  return nullptr;
}

}  // namespace

Launcher::Launcher(LaunchOptions options, JobSpec job, int signal_fd, Console& console)
    : options_(std::move(options)), job_(std::move(job)), signal_fd_(signal_fd), console_(console) {}

Launcher::~Launcher() {
  StopAll();  // idempotent; Subprocess destructors would stop stragglers anyway
  for (auto& a : agents_) {
    if (a->log_fd >= 0) ::close(a->log_fd);
  }
}

std::chrono::milliseconds Launcher::Elapsed() const {
  return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - start_);
}

std::optional<int> Launcher::CheckSignal() {
  signalfd_siginfo info;
  if (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
    return 128 + static_cast<int>(info.ssi_signo);
  }
  return std::nullopt;
}

Status Launcher::Prepare() {
  TRELLIS_ASSIGN_OR_RETURN(paths_.bin_dir, SelfExeDir());
  for (const char* p : {"trellis-scheduler", "trellis-agent"}) {
    if (::access((paths_.bin_dir + "/" + p).c_str(), X_OK) != 0) {
      return NotFoundError(std::string(p) + " not found next to trellis-launch in " + paths_.bin_dir +
                           " (build it: cmake --build <build> --target " + p + ")");
    }
  }
  std::error_code ec;
  if (!options_.log_dir.empty()) {
    fs::create_directories(options_.log_dir, ec);
    if (ec) return InvalidArgumentError("--log-dir " + options_.log_dir + ": " + ec.message());
    paths_.run_dir = fs::absolute(options_.log_dir, ec).string();
  } else {
    std::string tmpl = "/tmp/trellis-" + job_.name + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) return InternalError("cannot create " + tmpl + ": " + strerror(errno));
    paths_.run_dir = tmpl;
    created_run_dir_ = true;
  }
  paths_.token_file = paths_.run_dir + "/token";
  if (options_.job_file.empty() || options_.job_flags.any()) {
    // Built or changed by flags: the scheduler reads the job as it runs, from the run directory.
    paths_.job_file = paths_.run_dir + "/job.yaml";
    std::ofstream out(paths_.job_file);
    out << JobSpecToYaml(job_);
    if (!out.flush()) return InternalError("cannot write " + paths_.job_file);
  } else {
    paths_.job_file = fs::absolute(options_.job_file, ec).string();
  }
  paths_.listen_host = options_.listen_host;
  paths_.connect_host = ConnectHostFor(options_.listen_host);
  if (options_.metrics) {
    // Picked now, bound by the children a moment later: a small race with other programs on
    // this machine, the price of knowing every target before anything starts. Picked together,
    // so that no two of the job's own listeners are given the same port.
    TRELLIS_ASSIGN_OR_RETURN(metrics_ports_, PickFreePorts(paths_.listen_host, MetricsPortsFor(job_) + 1));
    scheduler_metrics_port_ = metrics_ports_.back();
    metrics_ports_.pop_back();
  }
  TRELLIS_RETURN_IF_ERROR(PrepareTls());
  TRELLIS_ASSIGN_OR_RETURN(std::string token, RandomToken());
  return WriteSecretFile(paths_.token_file, token + "\n");
}

Status Launcher::PrepareTls() {
  const TlsSpec& spec = job_.tls;
  std::error_code ec;
  // A cluster job names a Secret that exists only in its namespace: here the run gets its own CA
  // (as with --tls), unless the mounted files happen to be on this machine.
  const bool from_secret = !spec.secretName.empty() && !fs::exists(spec.caFile, ec);
  if (options_.tls || from_secret) {
    const std::string dir = paths_.run_dir + "/tls";
    fs::create_directories(dir, ec);
    if (ec) return InternalError("cannot create " + dir + ": " + ec.message());
    auto files = WriteJobCertificates(dir, spec.serverName);
    if (!files.ok()) return files.status().Annotate("making the run's TLS certificates");
    paths_.tls = *files;
  } else if (spec.enabled()) {
    // Relative paths are the job file's neighbours, wherever trellis-launch runs from.
    const fs::path base = fs::path(paths_.job_file).parent_path();
    auto resolve = [&](const std::string& p) { return (base / p).lexically_normal().string(); };
    paths_.tls = TlsFilesOf(spec);
    paths_.tls.ca_file = resolve(spec.caFile);
    paths_.tls.cert_file = resolve(spec.certFile);
    paths_.tls.key_file = resolve(spec.keyFile);
  }
  auto tls = LoadTls(paths_.tls);  // bad files fail here, before any process starts
  if (!tls.ok()) return tls.status().Annotate("spec.tls");
  tls_ = *tls;
  return Status::Ok();
}

Status Launcher::StartScheduler() {
  const std::string port_file = paths_.run_dir + "/scheduler.port";
  fs::remove(port_file);
  scheduler_ = std::make_unique<Child>();
  scheduler_->plan = PlanScheduler(paths_, CurrentEnvironment(), job_.name, scheduler_metrics_port_);
  if (const auto colon = paths_.scheduler_address.rfind(':'); colon != std::string::npos) {
    // A restart: where every process of the job already connects.
    auto& argv = scheduler_->plan.spawn.argv;
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--port") argv[i + 1] = paths_.scheduler_address.substr(colon + 1);
    }
  }
  TRELLIS_ASSIGN_OR_RETURN(scheduler_->process, Subprocess::Start(scheduler_->plan.spawn));
  // The scheduler writes its port atomically once it serves.
  auto deadline = std::chrono::steady_clock::now() + options_.scheduler_start_timeout;
  while (true) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      paths_.scheduler_address = paths_.connect_host + ":" + std::to_string(port);
      // Where `trellis-launch resize` finds it (resize_command.h).
      return WriteSchedulerClientFile(paths_.run_dir, paths_.scheduler_address, paths_.tls);
    }
    if (auto s = scheduler_->process->Poll()) {
      scheduler_->exit = s;
      return UnavailableError("the scheduler " + s->Describe() + " before serving");
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceededError("the scheduler did not write " + port_file + " within " +
                                   Seconds(options_.scheduler_start_timeout));
    }
    pollfd pfd{signal_fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 20) > 0) return CancelledError("signal");
  }
}

Status Launcher::StartAgents() {
  std::vector<ProcessPlan> plans =
      PlanAgents(job_, paths_, CurrentEnvironment(), options_.agent_stop_grace, metrics_ports_);
  for (ProcessPlan& plan : plans) {
    auto child = std::make_unique<Child>();
    child->plan = std::move(plan);
    if (child->plan.kind == ProcessPlan::Kind::kWorker) {
      std::string log = paths_.run_dir + "/" + child->plan.name + ".log";
      child->log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    if (!child->plan.start_on_grow) TRELLIS_RETURN_IF_ERROR(Spawn(*child));
    agents_.push_back(std::move(child));
  }
  return WriteMetricsTargets();
}

Status Launcher::WriteMetricsTargets() {
  if (!options_.metrics) return Status::Ok();
  std::vector<const ProcessPlan*> all = {&scheduler_->plan};
  for (const auto& a : agents_) {
    if (a->process) all.push_back(&a->plan);  // not the slots no grow brought in yet
  }
  const std::string file = options_.metrics_targets.empty() ? paths_.run_dir + "/prometheus-targets.json"
                                                            : options_.metrics_targets;
  // Atomic: Prometheus watches the file and must never read half of it.
  TRELLIS_RETURN_IF_ERROR(WriteFileAtomic(file, FileSdTargets(all)));
  metrics_targets_file_ = file;
  return Status::Ok();
}

Status Launcher::Spawn(Child& c) {
  auto p = Subprocess::Start(c.plan.spawn);
  if (!p.ok()) return p.status().Annotate("starting the agent of " + c.plan.name);
  c.process = std::move(p).value();
  c.process->set_destructor_grace(options_.stop_grace);
  c.exit.reset();
  c.splitter = LineSplitter();
  if (int fd = c.process->stdout_pipe(); fd >= 0) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    c.pipe_open = true;
  }
  return Status::Ok();
}

Status Launcher::StartJoiners() {
  std::vector<int32_t> joiners;
  int to = 0;
  int64_t epoch = 0;
  {
    MutexLock lock(&mu_);
    const auto& world = training_.world().members();
    to = training_.resize_pending_members_size();
    epoch = training_.resize_pending_epoch();
    for (int32_t m : training_.resize_pending_members()) {
      if (std::find(world.begin(), world.end(), m) == world.end()) joiners.push_back(m);
    }
  }
  int32_t servers_to = 0, servers_now = job_.servers.replicas;
  {
    MutexLock lock(&mu_);
    servers_to = training_.resize_pending_servers();
    if (training_.world().servers() > 0) servers_now = training_.world().servers();
  }
  bool first_start = false;
  for (auto& a : agents_) {
    // A slot beyond the job's first size that no grow brought in yet has no process.
    const bool never_started = !a->process;
    if (a->plan.kind == ProcessPlan::Kind::kServer) {
      // A server grow: the servers it adds start now; it is announced once they are ready.
      if (a->plan.index < servers_now || a->plan.index >= servers_to) continue;
      if (!never_started && !a->exit) continue;
      if (a->grow_epoch == epoch) continue;
      a->grow_epoch = epoch;
      a->lost = false;  // a rank once taken over by another server's pod runs as itself again
      console_.Line("trellis-launch: " + a->plan.name + (never_started ? " starts" : " starts again") +
                    ": the job grows to " + std::to_string(servers_to) + " servers (" + Seconds(Elapsed()) + ")");
      TRELLIS_RETURN_IF_ERROR(Spawn(*a));
      first_start = first_start || never_started;
      continue;
    }
    if (a->plan.kind != ProcessPlan::Kind::kWorker) continue;
    if (!never_started && (!a->exit || (a->exit->exit_code != 0 && !a->lost))) continue;
    if (std::find(joiners.begin(), joiners.end(), a->plan.index) == joiners.end()) continue;
    if (a->grow_epoch == epoch) continue;  // started for this grow already (the progress lags)
    a->grow_epoch = epoch;
    a->lost = false;
    console_.Line("trellis-launch: " + a->plan.name + (never_started ? " starts" : " starts again") +
                  ": the job grows to " + std::to_string(to) + " workers (" + Seconds(Elapsed()) + ")");
    TRELLIS_RETURN_IF_ERROR(Spawn(*a));
    first_start = first_start || never_started;
  }
  return first_start ? WriteMetricsTargets() : Status::Ok();
}

void Launcher::PumpOutput(Child& c, bool drain) {
  if (!c.pipe_open) return;
  const int fd = c.process->stdout_pipe();
  auto deadline = std::chrono::steady_clock::now() + milliseconds(1000);
  char buf[8192];
  const std::string prefix = "[" + c.plan.name + "] ";
  auto emit = [&](const std::string& line) {
    console_.Line(prefix + line);
    if (c.log_fd >= 0) {
      std::string l = line + "\n";
      ssize_t ignored = ::write(c.log_fd, l.data(), l.size());
      (void)ignored;
    }
  };
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      for (const auto& line : c.splitter.Feed(std::string_view(buf, static_cast<size_t>(n)))) emit(line);
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) {  // end of stream
      if (std::string rest = c.splitter.Flush(); !rest.empty()) emit(rest);
      c.pipe_open = false;
      return;
    }
    // Nothing more now. After the agent exited, wait (bounded) for its last bytes.
    if (!drain || std::chrono::steady_clock::now() > deadline) return;
    pollfd pfd{fd, POLLIN, 0};
    ::poll(&pfd, 1, 50);
  }
}

void Launcher::WatchCluster() {
  int64_t after = 0;
  auto progress_due = std::chrono::steady_clock::now();
  // Training progress once a second (the workers report about that often). An elastic job's
  // progress also says a grow waits for its joiners, whose agents start from here: every
  // 250 ms, so a grow does not wait up to a second for its joiners' programs to be started.
  const milliseconds progress_every(job_.elastic.enabled ? 250 : 1000);
  MutexLock lock(&mu_);
  while (!stop_watch_) {
    lock.Unlock();
    auto v = client_->GetCluster(after, false, std::min(milliseconds(500), progress_every));
    std::optional<v1::JobProgress> p;
    if (std::chrono::steady_clock::now() >= progress_due) {
      progress_due = std::chrono::steady_clock::now() + progress_every;
      if (auto r = client_->GetProgress(); r.ok()) p = std::move(r).value();
    }
    lock.Lock();
    if (p) training_ = std::move(*p);
    if (v.ok()) {
      after = v->version();
      view_ = std::move(v).value();
    } else {
      const auto retry_at = std::chrono::steady_clock::now() + milliseconds(200);
      while (!stop_watch_) {
        if (!cv_.WaitUntil(&mu_, retry_at)) break;
      }
    }
  }
}

std::string Launcher::OutOfTheWorld(const Child& agent) {
  if (!job_.elastic.enabled || agent.plan.kind != ProcessPlan::Kind::kWorker || !client_) return "";
  auto view = client_->GetCluster(0, /*wait_complete=*/false, milliseconds(1000));
  if (!view.ok() || InTheWorld(*view, v1::ROLE_WORKER, agent.plan.index)) return "";
  // Started for a grow whose world never came: it was given up (a joiner that cannot join exits 0).
  if (agent.grow_epoch > view->world().epoch()) return "did not join: the grow was given up (its log says why)";
  return "left the job: resized away";
}

bool Launcher::ServerOutsideWorld(const Child& agent) {
  if (!job_.elastic.enabled || agent.plan.kind != ProcessPlan::Kind::kServer || !client_) return false;
  auto view = client_->GetCluster(0, /*wait_complete=*/false, milliseconds(1000));
  return view.ok() && !InTheWorld(*view, v1::ROLE_SERVER, agent.plan.index);
}

std::string Launcher::TakenOver(const Child& agent) {
  if (!job_.elastic.enabled || agent.plan.kind != ProcessPlan::Kind::kServer || !client_) return "";
  auto view = client_->GetCluster(0, /*wait_complete=*/false, milliseconds(1000));
  const v1::NodeInfo* taken = view.ok() ? TakenOverFrom(*view, agent.plan.index, job_.name + "-" + agent.plan.name)
                                         : nullptr;
  if (taken == nullptr) return "";
  std::string by = taken->taken_over_by();
  if (by.rfind(job_.name + "-", 0) == 0) by = by.substr(job_.name.size() + 1);
  return by;
}

std::string Launcher::LostWorker(const Child& agent) {
  if (!job_.elastic.enabled || agent.plan.kind != ProcessPlan::Kind::kWorker || !client_) return "";
  auto view = client_->GetCluster(0, /*wait_complete=*/false, milliseconds(1000));
  const v1::LostWorker* lost = view.ok() ? LostEntry(*view, agent.plan.index) : nullptr;
  return lost ? lost->why() : "";
}

std::string Launcher::LostWhileSilent(const Child& agent) {
  if (!job_.elastic.enabled || agent.plan.kind != ProcessPlan::Kind::kWorker) return "";
  MutexLock lock(&mu_);
  const v1::LostWorker* lost = view_ ? LostEntry(*view_, agent.plan.index) : nullptr;
  return lost && lost->silent() ? lost->why() : "";
}

std::string Launcher::Progress() {
  MutexLock lock(&mu_);
  return FormatProgress(view_ ? &*view_ : nullptr);
}

std::string Launcher::Training() {
  MutexLock lock(&mu_);
  return FormatTraining(training_);
}

void Launcher::StopAll() {
  if (!metrics_targets_file_.empty()) {  // the targets go with the job
    std::error_code ec;
    fs::remove(metrics_targets_file_, ec);
    metrics_targets_file_.clear();
  }
  // The watcher may be inside a long poll; it is joined at the end, not waited for now.
  {
    MutexLock lock(&mu_);
    stop_watch_ = true;
  }
  cv_.SignalAll();
  // Agents first (each forwards SIGTERM to its program), then the scheduler they talk to.
  std::vector<Child*> running;
  for (auto& a : agents_) {
    if (a->process && !a->exit) {
      if (auto s = a->process->Poll()) {
        a->exit = s;
      } else {
        (void)a->process->Signal(SIGTERM);
        running.push_back(a.get());
      }
    }
  }
  auto deadline = std::chrono::steady_clock::now() + options_.stop_grace;
  bool killed = false;
  for (Child* c : running) {
    while (!c->exit) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      c->exit = c->process->WaitFor(std::max(milliseconds(0), std::min(left, milliseconds(100))));
      if (c->exit) break;
      PumpOutput(*c, false);  // a worker blocked on a full pipe could not die otherwise
      // A second Ctrl-C, or the grace period over: no more waiting.
      if (!killed && (CheckSignal() || left.count() <= 0)) {
        for (Child* k : running) {
          if (!k->exit) (void)k->process->Signal(SIGKILL);
        }
        killed = true;
      }
    }
    PumpOutput(*c, true);
  }
  if (scheduler_ && scheduler_->process && !scheduler_->exit) {
    scheduler_->exit = scheduler_->process->Stop(options_.stop_grace);
  }
  if (watch_thread_.joinable()) watch_thread_.join();
}

void Launcher::PollAndPump(milliseconds wait, bool wake_on_exit) {
  std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
  std::vector<Child*> readers;
  for (auto& a : agents_) {
    if (a->pipe_open) {
      fds.push_back({a->process->stdout_pipe(), POLLIN, 0});
      readers.push_back(a.get());
    }
  }
  for (auto& a : agents_) {  // wake at once when an agent exits
    if (wake_on_exit && a->process && !a->exit && a->process->exit_fd() >= 0) fds.push_back({a->process->exit_fd(), POLLIN, 0});
  }
  ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  for (size_t i = 0; i < readers.size(); ++i) {
    if (fds[i + 1].revents != 0) PumpOutput(*readers[i], false);
  }
}

int Launcher::Fail(const std::string& message, const Child* culprit) {
  console_.ClearStatus();
  console_.Line(message);
  if (culprit != nullptr) {
    std::string log = paths_.run_dir + "/" + culprit->plan.name + ".log";
    std::string tail = TailFile(log, 15);
    if (!tail.empty()) {
      console_.Line("--- last lines of " + log + " ---");
      std::istringstream lines(tail);
      for (std::string l; std::getline(lines, l);) console_.Line(l);
      console_.Line("---");
    }
  }
  StopAll();
  console_.ClearStatus();
  if (!paths_.run_dir.empty()) console_.Line("logs kept in " + paths_.run_dir);
  return 1;
}

int Launcher::Run() {
  if (Status s = Prepare(); !s.ok()) {
    console_.Line("trellis-launch: " + s.message());
    return 1;
  }
  console_.Line("trellis-launch: job " + job_.name + ": " + std::to_string(job_.servers.replicas) + " servers x " +
                std::to_string(job_.workers.replicas) + " workers; logs in " + paths_.run_dir);
  if (job_.elastic.enabled) {
    const bool servers = job_.elastic.minServers != job_.elastic.maxServers;
    console_.Line("trellis-launch: elastic (" + std::to_string(job_.elastic.minWorkers) + " to " +
                  std::to_string(job_.elastic.maxWorkers) + " workers" +
                  (servers ? ", " + std::to_string(job_.elastic.minServers) + " to " +
                                 std::to_string(job_.elastic.maxServers) + " servers"
                           : std::string()) +
                  "): resize with trellis-launch resize " + paths_.run_dir + " WORKERS" +
                  (servers ? " (or --servers N)" : ""));
  }
  if (Status s = StartScheduler(); !s.ok()) {
    if (s.code() == StatusCode::kCancelled) {
      StopAll();
      return 130;
    }
    return Fail("job " + job_.name + " failed: " + s.message(), scheduler_.get());
  }
  if (Status s = StartRun(); !s.ok()) return Fail("job " + job_.name + " failed: " + s.message(), nullptr);
  return Supervise();
}

Status Launcher::StartRun() {
  TRELLIS_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(paths_.token_file));
  TRELLIS_ASSIGN_OR_RETURN(client_, SchedulerClient::Connect({paths_.scheduler_address, token, milliseconds(5000), tls_}));
  {
    MutexLock lock(&mu_);
    stop_watch_ = false;
  }
  watch_thread_ = std::thread([this] { WatchCluster(); });
  return StartAgents();
}

int Launcher::RestartJobOrFail(const std::vector<Child*>& failed) {
  if (job_.runPolicy.failurePolicy != FailurePolicy::kRestartJob) return FailAgent(failed);
  auto view = client_->GetCluster(0, false, milliseconds(1000));
  if (!view.ok() || !view->failed()) return FailAgent(failed);  // a failure the job itself handles
  for (const Child* c : failed) {
    // A configuration the program refuses is refused again after a restart.
    if (c->exit && c->exit->exit_code == kExitConfigurationError) return FailAgent(failed);
  }
  const int limit = job_.runPolicy.backoffLimit;
  if (job_restarts_ >= limit) {
    return Fail("job " + job_.name + " failed: " + view->failure_message() + " after " + std::to_string(job_restarts_) +
                    " whole-job restarts (runPolicy.failurePolicy RestartJob, backoffLimit " + std::to_string(limit) + ")",
                failed.front());
  }
  ++job_restarts_;
  console_.ClearStatus();
  console_.Line("trellis-launch: the job's scheduler failed the job (" + Seconds(Elapsed()) + "): " +
                view->failure_message());
  console_.Line("trellis-launch: restarting every process, from the newest checkpoint (runPolicy.failurePolicy "
                "RestartJob; restart " + std::to_string(job_restarts_) + " of at most " + std::to_string(limit) + ")");
  StopAll();
  for (auto& a : agents_) {
    if (a->log_fd >= 0) ::close(a->log_fd);
  }
  agents_.clear();
  client_.reset();
  {
    MutexLock lock(&mu_);
    view_.reset();
    training_ = v1::JobProgress();
  }
  Status s = StartScheduler();  // on the same port, a new job state
  if (s.ok()) s = StartRun();
  if (!s.ok()) return Fail("job " + job_.name + " failed: restarting the job: " + s.message(), scheduler_.get());
  console_.Line("trellis-launch: job restarted (" + Seconds(Elapsed()) + ")");
  return -1;
}

int Launcher::FailAgent(const std::vector<Child*>& failed) {
  // The scheduler's view: restart counts, and which pod failed the job first (when several
  // agents ended in the same round, the others usually failed because of that one).
  if (auto v = client_->GetCluster(0, false, milliseconds(1000)); v.ok()) {
    MutexLock lock(&mu_);
    view_ = *v;
  }
  Child* culprit = failed.front();
  Child* named = nullptr;  // the agent whose pod the scheduler's failure message names
  {
    MutexLock lock(&mu_);
    if (view_) {
      for (auto& a : agents_) {
        if (view_->failure_message().find("(pod " + job_.name + "-" + a->plan.name + ")") != std::string::npos) {
          named = a.get();
        }
      }
    }
  }
  if (named != nullptr && named->process && !named->exit) {
    // Its agent is still reporting and exiting; the bystanders were just quicker.
    named->exit = named->process->WaitFor(milliseconds(2000));
    if (named->exit) PumpOutput(*named, true);
  }
  if (named != nullptr && named->exit && named->exit->exit_code != 0) culprit = named;
  int restarts = 0;
  {
    MutexLock lock(&mu_);
    if (view_) {
      const std::string pod = job_.name + "-" + culprit->plan.name;
      for (const auto* list : {&view_->servers(), &view_->workers()}) {
        for (const auto& n : *list) {
          if (n.pod_name() == pod) restarts = n.restarts();
        }
      }
    }
  }
  const auto& plan = culprit->plan;
  if (plan.kind == ProcessPlan::Kind::kServer && culprit->exit->exit_code == 0) {
    return Fail("job " + job_.name + " failed: " + plan.name + " exited with code 0 while workers were still running",
                culprit);
  }
  if (culprit->exit->signal != 0) {
    return Fail(AgentDiedMessage(job_.name, KindName(plan.kind), plan.index, culprit->exit->signal), culprit);
  }
  const RoleSpec& role = plan.kind == ProcessPlan::Kind::kServer ? job_.servers : job_.workers;
  std::string why;  // the scheduler's reason, when it failed the job for another than this exit
  {
    MutexLock lock(&mu_);
    const std::string pod = "(pod " + job_.name + "-" + plan.name + ")";
    // An elastic job's scheduler says why it could not go on without this worker (minWorkers).
    if (view_ && view_->failed() &&
        (view_->failure_message().find(pod) == std::string::npos || job_.elastic.enabled)) {
      why = "; the job's scheduler failed the job: " + view_->failure_message();
    }
  }
  return Fail(FailureMessage(job_.name, KindName(plan.kind), plan.index, culprit->exit->exit_code, restarts,
                             job_.RestartPolicyFor(role)) + why,
              culprit);
}

int Launcher::RestartScheduler() {
  const std::string what = "the scheduler " + scheduler_->exit->Describe();
  const int limit = job_.runPolicy.backoffLimit;
  if (scheduler_restarts_ >= limit) {
    return Fail("job " + job_.name + " failed: " + what + " after " +
                    std::to_string(scheduler_restarts_) + " restarts (backoffLimit " +
                    std::to_string(limit) + ")",
                scheduler_.get());
  }
  ++scheduler_restarts_;
  console_.ClearStatus();
  console_.Line("trellis-launch: " + what + " (" + Seconds(Elapsed()) + "); restarting it on " +
                paths_.scheduler_address + " (restart " + std::to_string(scheduler_restarts_) +
                " of at most " + std::to_string(limit) +
                "); the running job's members hand its state back");
  if (Status s = StartScheduler(); !s.ok()) {
    return Fail("job " + job_.name + " failed: restarting the scheduler: " + s.message(),
                scheduler_.get());
  }
  console_.Line("trellis-launch: scheduler restarted (" + Seconds(Elapsed()) + ")");
  return -1;
}

int Launcher::Supervise() {
  // activeDeadlineSeconds bounds the whole run; -1: none.
  const int64_t deadline_ms = job_.runPolicy.activeDeadlineSeconds.value_or(-1) * 1000;
  while (true) {
    if (auto code = CheckSignal()) {
      console_.ClearStatus();
      (void)AwaitExitCheckpoint(*code - 128);
      console_.Line("trellis-launch: got " + SignalName(*code - 128) + "; stopping every process");
      StopAll();
      console_.Line("logs kept in " + paths_.run_dir);
      return *code;
    }
    PollAndPump(milliseconds(200), /*wake_on_exit=*/true);

    int workers_ok = 0, workers_started = 0;
    std::vector<Child*> failed;  // agents that exited non-zero (or servers at all) in this round
    for (auto& a : agents_) {
      if (!a->process) continue;  // a worker slot no grow brought in (yet)
      if (a->plan.kind == ProcessPlan::Kind::kWorker) ++workers_started;
      if (!a->exit) {
        a->exit = a->process->Poll();
        // Frozen, not exited: nothing else would ever stop it (nor the job wait for it).
        const std::string silent = a->exit ? "" : LostWhileSilent(*a);
        if (!a->exit && silent.empty()) continue;
        if (!silent.empty()) a->exit = a->process->Stop(milliseconds(0));
        PumpOutput(*a, true);
        if (!silent.empty()) {
          a->lost = true;
          console_.Line("trellis-launch: " + a->plan.name + " lost (" + silent +
                        "): stopped it; the job goes on without it (spec.elastic; " + Seconds(Elapsed()) + ")");
        } else if (a->plan.kind == ProcessPlan::Kind::kServer && ServerOutsideWorld(*a)) {
          console_.Line("trellis-launch: " + a->plan.name +
                        (a->exit->exit_code == 0
                             ? " left the job: resized away, its slices moved to the others ("
                             : " ended outside the job's world (" + a->exit->Describe() +
                                   "): the server grow it was started for is given up; the job goes on (") +
                        Seconds(Elapsed()) + ")");
        } else if (const std::string by = TakenOver(*a); !by.empty()) {
          a->lost = true;
          console_.Line("trellis-launch: " + a->plan.name + " lost (" + a->exit->Describe() + "): " + by +
                        " takes its shards over and runs it from now on (spec.elastic; " + Seconds(Elapsed()) + ")");
        } else if (a->exit->exit_code != 0 || a->plan.kind == ProcessPlan::Kind::kServer) {
          if (a->exit->exit_code != 0) a->lost = !LostWorker(*a).empty();
          if (!a->lost) {
            failed.push_back(a.get());
            continue;
          }
          console_.Line("trellis-launch: " + a->plan.name + " lost (" + a->exit->Describe() +
                        "): the job goes on without it (spec.elastic; " + Seconds(Elapsed()) + ")");
        } else {
          const std::string out_of_world = OutOfTheWorld(*a);
          console_.Line("trellis-launch: " + a->plan.name + " " + (out_of_world.empty() ? "finished" : out_of_world) +
                        " (" + Seconds(Elapsed()) + ")");
        }
      }
      if (a->plan.kind == ProcessPlan::Kind::kWorker && (a->exit->exit_code == 0 || a->lost)) ++workers_ok;
    }
    if (!failed.empty()) {
      if (int code = RestartJobOrFail(failed); code >= 0) return code;
      continue;
    }
    // Elastic jobs: a grow brings back workers that were resized away (docs/elastic.md).
    if (job_.elastic.enabled) {
      if (Status st = StartJoiners(); !st.ok()) return Fail("job " + job_.name + " failed: " + st.ToString(), nullptr);
    }
    if (auto s = scheduler_->process->Poll()) {
      scheduler_->exit = s;
      if (int code = RestartScheduler(); code >= 0) return code;
    }
    // Every worker that ran finished (those a resize took away included).
    if (workers_ok == workers_started) {
      StopAll();
      console_.ClearStatus();
      std::string where = "logs in " + paths_.run_dir;
      if (created_run_dir_ && !options_.keep_logs) {
        std::error_code ec;
        fs::remove_all(paths_.run_dir, ec);
        where = "logs removed; --keep-logs keeps them";
      }
      console_.Line("job " + job_.name + " succeeded in " + Seconds(Elapsed()) + " (" + where + ")");
      return 0;
    }
    if (deadline_ms >= 0 && Elapsed().count() > deadline_ms) {
      return Fail("job " + job_.name + " failed: activeDeadlineSeconds (" +
                      std::to_string(*job_.runPolicy.activeDeadlineSeconds) + ") exceeded after " +
                      Seconds(Elapsed()),
                  nullptr);
    }
    console_.Progress(job_.name, Progress(), Elapsed(), Training());
  }
}

}  // namespace trellis
