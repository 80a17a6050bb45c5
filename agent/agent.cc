#include "agent/agent.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include "agent/malloc_env.h"
#include "common/tls/tls.h"
#include "common/tls/auth.h"
#include "common/config/env_names.h"
#include "common/config/env.h"
#include "common/base/logging.h"
#include "common/base/net.h"

namespace trellis {
namespace {

bool Retryable(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded;
}

// What every registration of this pod says: the job, its role, the pod and where it runs.
v1::RegisterRequest RegisterRequestOf(const AgentConfig& config) {
  v1::RegisterRequest req;
  req.set_job(config.job);
  req.set_role(config.role);
  req.set_pod_name(config.pod_name);
  req.set_host(config.host);
  req.set_gpus(config.gpus);
  return req;
}

}  // namespace

StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentConfig config) {
  TRELLIS_ASSIGN_OR_RETURN(std::string token, ReadTokenFile(config.token_file));
  SchedulerClientOptions opts;
  opts.address = config.scheduler_address;
  opts.token = token;
  TRELLIS_ASSIGN_OR_RETURN(opts.tls, LoadTlsFromEnv(EnvSource()));
  TRELLIS_ASSIGN_OR_RETURN(auto client, SchedulerClient::Connect(opts));
  std::unique_ptr<Agent> agent(new Agent(std::move(config), std::move(client)));

  // The job's settings: flags and environment win; the job YAML fills the rest.
  RunPolicySpec defaults;
  RestartPolicy policy = defaults.restartPolicy;
  int32_t limit = defaults.backoffLimit;
  auto yaml = agent->client_->GetJobYaml();
  if (!yaml.ok()) {
    TLOG_WARN << "job settings from the scheduler unavailable (" << yaml.status().ToString()
              << "); using defaults";
  } else if (auto spec = ParseJobSpec(*yaml); !spec.ok()) {
    TLOG_WARN << "job YAML from the scheduler does not parse (" << spec.status().ToString()
              << "); using defaults";
  } else {
    const RoleSpec& role = agent->config_.role == v1::ROLE_SERVER ? spec->servers : spec->workers;
    policy = spec->RestartPolicyFor(role);
    limit = spec->runPolicy.backoffLimit;
    agent->heartbeat_interval_ = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(0.05, spec->scheduler.heartbeatIntervalSeconds) * 1000));
    agent->registration_timeout_ = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(1.0, spec->scheduler.registrationTimeoutSeconds) * 1000));
  }
  const AgentConfig& c = agent->config_;
  agent->restart_.policy = c.restart_policy.value_or(policy);
  agent->restart_.backoff_limit = c.backoff_limit.value_or(limit);
  agent->restart_.backoff_initial = c.backoff_initial;
  agent->restart_.backoff_max = c.backoff_max;
  agent->restart_.stop_grace = c.stop_grace;
  if (agent->LocalSize() > 1) {
    agent->spawner_ = std::make_unique<ProcessGroupSpawner>(agent->LocalSize(), c.stop_grace);
  } else {
    agent->spawner_ = std::make_unique<SubprocessSpawner>();
  }
  if (c.role == v1::ROLE_WORKER && agent->LocalSize() == 1) {
    // Byte totals that survive a killed program; without one they cover the live process only.
    auto ledger = ByteLedger::Create();
    if (ledger.ok()) {
      agent->ledger_ = std::move(*ledger);
    } else {
      TLOG_WARN << "no byte ledger (" << ledger.status().ToString()
                << "): a restarted program's byte totals will not include its predecessors'";
    }
  }
  if (Status st = agent->MakeErrorDir(); !st.ok()) {
    TLOG_WARN << st.ToString() << "; the program gets no " << kEnvErrorFile
              << ", its errors will not be in the termination message";
  }
  agent->supervisor_ =
      std::make_unique<Supervisor>(agent->restart_, *agent->spawner_, *agent, agent->timer_);
  return agent;
}

Agent::Agent(AgentConfig config, std::unique_ptr<SchedulerClient> client)
    : config_(std::move(config)), client_(std::move(client)) {}

Agent::~Agent() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (!error_dir_.empty()) {
    std::error_code ec;  // remove_all follows no links the program may have left there
    std::filesystem::remove_all(error_dir_, ec);
  }
}

Status Agent::MakeErrorDir() {
  std::string base = EnvSource().GetOr("TMPDIR", "/tmp");
  if (base.empty() || base[0] != '/') base = "/tmp";
  std::string tmpl = base + "/trellis-agent-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return InternalError("cannot create " + tmpl + ": " + strerror(errno));
  error_dir_ = tmpl;
  error_file_ = error_dir_ + "/program-error";
  return Status::Ok();
}

std::string Agent::TakeProgramError() {
  if (error_file_.empty()) return "";
  std::string error = ReadProgramError(error_file_);
  std::error_code ec;
  std::filesystem::remove_all(error_file_, ec);
  return error;
}

int Agent::Run() {
  TLOG_INFO << RoleName(config_.role) << " agent for job " << config_.job << ", pod " << config_.pod_name
            << ", scheduler " << config_.scheduler_address << ", restartPolicy "
            << ToString(restart_.policy) << ", backoffLimit " << restart_.backoff_limit;
  if (config_.take_over_server >= 0) {
    TLOG_WARN << "taking over server " << config_.take_over_server << " (lost for good; elastic servers)";
  }
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  SupervisorResult r = supervisor_->Run();
  std::unique_ptr<TakeoverAgents> takeovers;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    takeovers.swap(takeovers_);
  }
  cv_.SignalAll();
  heartbeat_thread_.join();
  // The ranks this pod took over end with it (the scheduler has another server take them over).
  if (takeovers) takeovers->Stop(restart_.stop_grace);
  int32_t finished_rank;
  {
    MutexLock lock(&mu_);
    finished_rank = finished_rank_;
  }
  if (finished_rank >= 0) {
    TLOG_INFO << "worker " << finished_rank << " (pod " << config_.pod_name
              << ") finished before this pod was made (its program exited 0): nothing to run, exiting 0";
    report_.exit = "worker " + std::to_string(finished_rank) + " had finished already: nothing to run";
    return 0;
  }
  if (!r.error.ok()) {
    TLOG_ERROR << "cannot run the " << RoleName(config_.role) << " program: " << r.error.ToString();
    report_.error = "cannot run the " + std::string(RoleName(config_.role)) + " program: " + r.error.ToString();
    report_.restarts = r.restarts;
    report_.program_error = TakeProgramError();  // an earlier start's, when one ran and failed
    return r.AgentExitCode();
  }
  int32_t rank;
  bool reported;
  {
    MutexLock lock(&mu_);
    rank = rank_;
    reported = final_exit_reported_;
  }
  if (r.stopped && !reported && rank >= 0) {
    // Stopped during a back-off: the scheduler still expects a restart from this pod; tell it
    // the pod is gone (preempted, or final under Never).
    SendExitReport(ExitReport(r.last, /*will_restart=*/false));
  }
  FinishReport(r, rank);
  TLOG_INFO << RoleName(config_.role) << " " << rank << " (pod " << config_.pod_name << ") exiting with code "
            << ExitCodeWithSignal(r.last.exit_code) << " after " << r.restarts << " restarts (restartPolicy "
            << ToString(restart_.policy) << ")" << (r.stopped ? ", stopped by signal" : "");
  return r.AgentExitCode();
}

void Agent::FinishReport(const SupervisorResult& r, int32_t rank) {
  report_.exit = "program " + r.last.Describe();
  report_.restarts = r.restarts;
  // Only the last start's (the file is emptied before each), and only for a failure.
  const std::string program_error = TakeProgramError();
  if (r.last.exit_code != 0) report_.program_error = program_error;
  if (!last_start_error_.ok()) {
    report_.error = last_start_error_.message();
    if (last_start_error_.code() == StatusCode::kNotFound) report_.command_not_found = program_;
  }
  if (r.stopped || rank < 0) return;
  if (config_.role == v1::ROLE_SERVER) {
    // Elastic servers: another server's pod took this rank over (the scheduler decided when the
    // exit was reported); the operator does not make this pod again, nor fail the job for it.
    auto view = client_->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(2000));
    const v1::NodeInfo* taken = view.ok() && !view->failed() ? TakenOverFrom(*view, rank, config_.pod_name) : nullptr;
    if (taken != nullptr) {
      report_.taken_over = TakeOverMessage(*taken);
      return;
    }
  }
  if (r.last.exit_code == 0) return;
  // The exit was reported; a worker's failure has failed the job at the scheduler by now, or
  // (an elastic job) left the worker out. Either way no replacement of this pod can join the
  // job: say so, so the operator does not make one.
  // A busy scheduler may miss one short deadline; a missing answer would make the operator
  // recreate a pod that cannot join, so a question that timed out is asked again (10 s at most).
  // One that was refused (no scheduler any more) is not.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  auto view = client_->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(2000));
  while (!view.ok() && view.status().code() == StatusCode::kDeadlineExceeded &&
         std::chrono::steady_clock::now() + std::chrono::milliseconds(2000) <= give_up) {
    view = client_->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(2000));
  }
  if (view.ok() && view->failed()) report_.job_failed = view->failure_message();
  // An elastic job's worker left out for good: its pod is not made again (the operator reads it).
  if (view.ok() && !view->failed() && config_.role == v1::ROLE_WORKER) {
    for (const auto& lost : view->lost_workers()) {
      if (lost.slot() == rank) report_.lost = lost.why();
    }
  }
}

void Agent::OnStarted(const Process& /*process*/, int /*attempt*/) { last_start_error_ = Status::Ok(); }

void Agent::OnStartFailed(const Status& error, int /*attempt*/) { last_start_error_ = error; }

void Agent::RequestStop(int signo) {
  if (signo == SIGTERM) AwaitTheJobsStop();
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    if (stop_signal_ == 0) stop_signal_ = signo;
    if (takeovers_) takeovers_->Signal(signo);
  }
  cv_.SignalAll();
  supervisor_->RequestStop(signo);
}

void Agent::AwaitTheJobsStop() {
  int32_t rank;
  int64_t incarnation;
  {
    MutexLock lock(&mu_);
    if (stopping_ || rank_ < 0) return;  // stopping already, or registering: nothing to keep
    rank = rank_;
    incarnation = incarnation_;
  }
  // The scheduler bounds the wait by the job's grace; this bound only guards against one that
  // keeps saying "wait" (the kubelet's SIGKILL ends it anyway).
  const auto start = std::chrono::steady_clock::now();
  std::string said;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(3600)) {
    if (supervisor_->state() != Supervisor::State::kRunning) return;  // the program ended meanwhile
    auto r = client_->PodStopping(config_.role, rank, incarnation);
    if (!r.ok()) {
      TLOG_INFO << "the pod is being stopped; the scheduler does not answer (" << r.status().message()
                << "): stopping the program";
      return;
    }
    if (r->reason() != said) {
      said = r->reason();
      TLOG_INFO << "the pod is being stopped: " << said << (r->wait() ? "; the program runs on" : "; stopping the program");
    }
    if (!r->wait()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

bool Agent::NoProgramRunning() const {
  auto s = supervisor_->state();
  return s == Supervisor::State::kIdle || s == Supervisor::State::kStarting;
}

StatusOr<v1::RegisterResponse> Agent::RegisterWithRetry(int attempt) {
  v1::RegisterRequest req = RegisterRequestOf(config_);
  {
    // A restart: a scheduler that restarted meanwhile gives the rank back from this.
    MutexLock lock(&mu_);
    if (rank_ >= 0) {
      req.set_previous_rank(rank_);
      req.set_previous_incarnation(incarnation_);
      req.set_previous_restarts(attempt);
    }
  }
  auto deadline = std::chrono::steady_clock::now() + registration_timeout_;
  while (true) {
    auto resp = client_->Register(req);
    if (resp.ok() || !Retryable(resp.status())) return resp;
    if (std::chrono::steady_clock::now() >= deadline) {
      return resp.status().Annotate("registering with the scheduler at " + config_.scheduler_address);
    }
    TLOG_WARN << "register: " << resp.status().ToString() << "; retrying";
    MutexLock lock(&mu_);
    const auto retry_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (!stopping_) {
      if (!cv_.WaitUntil(&mu_, retry_at)) break;
    }
    if (stopping_) return CancelledError("stopped while registering");
  }
}

StatusOr<std::vector<std::string>> Agent::ProgramArgv() const {
  if (!config_.command.empty()) return config_.command;
  // A server without a command runs the built-in parameter server: next to us, else on PATH.
  TRELLIS_ASSIGN_OR_RETURN(std::string dir, SelfExeDir());
  auto found = FindExecutable("trellis-pserver", dir + ":" + EnvSource().GetOr("PATH", "/usr/bin:/bin"));
  if (!found.ok()) return found.status().Annotate("server without a command");
  return std::vector<std::string>{*found};
}

StatusOr<SpawnOptions> Agent::PrepareStart(int attempt) {
  TRELLIS_ASSIGN_OR_RETURN(v1::RegisterResponse reg, RegisterWithRetry(attempt));
  if (reg.finished()) {
    MutexLock lock(&mu_);
    finished_rank_ = reg.rank();
    return CancelledError("worker " + std::to_string(reg.rank()) + " finished already");
  }
  if (config_.take_over_server >= 0 && reg.rank() != config_.take_over_server) {
    return FailedPreconditionError("the scheduler gave pod " + config_.pod_name + " server rank " +
                                   std::to_string(reg.rank()) + ", not server " +
                                   std::to_string(config_.take_over_server) + " that it takes over");
  }
  {
    MutexLock lock(&mu_);
    rank_ = reg.rank();
    incarnation_ = reg.incarnation();
    attempt_ = attempt;
  }
  cv_.SignalAll();  // the heartbeat thread starts once there is a rank
  if (!metrics_) {
    // Metrics are not worth failing the job for: say so and run the program anyway.
    if (Status st = StartMetrics(reg.rank()); !st.ok()) TLOG_ERROR << st.ToString();
  }
  int metrics_port = 0;
  if (config_.program_metrics_port) {
    metrics_port = *config_.program_metrics_port;
  } else {
    TRELLIS_ASSIGN_OR_RETURN(metrics_port, PickFreePort("0.0.0.0"));
  }
  SpawnOptions opts;
  TRELLIS_ASSIGN_OR_RETURN(opts.argv, ProgramArgv());
  program_ = opts.argv[0];
  opts.env = CurrentEnvironment();
  opts.env[kEnvRank] = std::to_string(reg.rank());
  opts.env[kEnvIncarnation] = std::to_string(reg.incarnation());
  // Whether a crash of the program is followed by a restart: trellis.torch keeps per-step
  // commits for a rejoin only then (docs/pytorch.md#fault-tolerance).
  opts.env[kEnvRestartPolicy] = std::string(ToString(restart_.policy));
  opts.env[kEnvMetricsPort] = std::to_string(metrics_port);
  opts.env[kEnvPodName] = config_.pod_name;
  opts.env[kEnvHost] = config_.host;
  if (LocalSize() > 1) {  // a fresh group name per start: a restarted group never meets a stale one
    opts.env[kEnvLocalGroup] = config_.job + "-w" + std::to_string(reg.rank()) + "-" +
                                      std::to_string(reg.incarnation()) + "-" +
                                      std::to_string(attempt);
  }
  if (config_.role == v1::ROLE_WORKER) AddMallocDefaults(opts.env);
  opts.env.erase(kEnvAgentMetricsPort);  // the agent's own, not the program's
  opts.env.erase(kEnvLedgerFd);                  // only ours, never an outer agent's
  opts.env.erase(kEnvLedgerSince);
  opts.env.erase(kEnvErrorFile);  // only ours, never an outer agent's
  if (!error_file_.empty()) {
    // An earlier start's error must not pass for this one's.
    std::error_code ec;
    std::filesystem::remove_all(error_file_, ec);
    if (ec) {
      TLOG_WARN << "removing " << error_file_ << ": " << ec.message() << "; the program gets no "
                << kEnvErrorFile << " from now on";
      error_file_.clear();
    } else {
      opts.env[kEnvErrorFile] = error_file_;
    }
  }
  if (ledger_) {
    // The ledger holds the programs this agent ran; a replaced pod's earlier ones are not in it.
    if (ledger_since_ == 0) ledger_since_ = reg.incarnation();
    opts.pass_fd = ledger_->fd();
    opts.env[kEnvLedgerFd] = std::to_string(kLedgerChildFd);
    opts.env[kEnvLedgerSince] = std::to_string(ledger_since_);
  }
  program_up_->Set(1);
  TLOG_INFO << RoleName(config_.role) << " rank " << reg.rank() << " incarnation " << reg.incarnation()
            << ": starting " << opts.argv[0]
            << (LocalSize() > 1 ? " x" + std::to_string(LocalSize()) + " (one per GPU)" : "");
  return opts;
}

Status Agent::StartMetrics(int32_t rank) {
  metrics_ = std::make_unique<MetricsRegistry>(MetricLabels{config_.job, std::string(RoleName(config_.role)), rank});
  restarts_ = &metrics_->Counter("trellis_agent_restarts_total", "Restarts of the supervised program");
  exits_ = &metrics_->Counter("trellis_agent_program_exits_total", "Exits of the supervised program, any code");
  program_up_ = &metrics_->Gauge("trellis_agent_program_up", "1 while the supervised program runs");
  if (!config_.metrics_port) return Status::Ok();
  auto s = MetricsHttpServer::Start(config_.metrics_host, *config_.metrics_port, *metrics_);
  if (!s.ok()) return s.status().Annotate("agent /metrics");
  metrics_server_ = std::move(*s);
  return Status::Ok();
}

bool Agent::MayRestart(const ExitStatus& status) {
  auto view = client_->GetCluster(0, /*wait_complete=*/false, std::chrono::milliseconds(1000));
  // A program that failed because the job did (a rejoin with no donor left, a barrier the
  // scheduler aborted) would only fail again: the job restarts as a whole or not at all.
  if (view.ok() && view->failed()) {
    TLOG_WARN << "not restarting the program: the scheduler has failed the job (" << view->failure_message() << ")";
    return false;
  }
  // Under Always a program that ended well is started again; one a resize took out of the world
  // would only idle outside it (a server nobody sends slices) or stay out (a worker): done, as
  // under OnFailure. A later grow starts its rank again.
  if (status.exit_code != 0) return true;
  int32_t rank;
  {
    MutexLock lock(&mu_);
    rank = rank_;
  }
  const std::string outside = view.ok() ? OutsideTheWorld(*view, config_.role, rank) : "";
  if (!outside.empty()) {
    TLOG_INFO << "not restarting the program: " << outside;
    return false;
  }
  // A worker that ended well finished the job's training: started again it would ask to rejoin
  // a job that holds no place for it (and, the last to end, fail it: no live worker to rejoin).
  // Decided without the scheduler, which may be gone once the job ended.
  if (config_.role == v1::ROLE_WORKER) {
    TLOG_INFO << "not restarting the program: worker " << rank
              << " exited 0, its training finished (restartPolicy Always restarts a worker only after a failure)";
    return false;
  }
  return true;
}

std::string OutsideTheWorld(const v1::ClusterView& view, v1::Role role, int32_t rank) {
  if (InTheWorld(view, role, rank)) return "";
  if (role == v1::ROLE_SERVER) {
    return "server " + std::to_string(rank) + " was resized away (the job's world has " +
           std::to_string(view.num_servers()) + " servers); a grow starts it again";
  }
  return "worker " + std::to_string(rank) + " is outside the job's world (resized away); a grow starts it again";
}

void Agent::OnExit(const ExitStatus& status, bool will_restart, int restarts) {
  // The program is gone, however it ended: what it moved becomes its successors' starting point.
  if (ledger_) {
    const uint64_t pushed = ledger_->live_pushed(), pulled = ledger_->live_pulled();
    ledger_->FoldEnded();
    TLOG_INFO << "the program moved " << pushed << " B pushed, " << pulled << " B pulled (the rank's "
              << ledger_->ended_pushed() << " B / " << ledger_->ended_pulled() << " B so far)";
  }
  if (metrics_) {
    program_up_->Set(0);
    exits_->Increment();
    if (will_restart) restarts_->Increment();
  }
  v1::ReportExitRequest req = ExitReport(status, will_restart);
  TLOG_INFO << req.message() << (will_restart ? "; restarting" : "");
  SendExitReport(req);
}

v1::ReportExitRequest Agent::ExitReport(const ExitStatus& status, bool will_restart) {
  v1::ReportExitRequest req;
  int stop_signal;
  {
    MutexLock lock(&mu_);
    req.set_rank(rank_);
    req.set_incarnation(incarnation_);
    stop_signal = stop_signal_;
    if (!will_restart) final_exit_reported_ = true;
  }
  req.set_role(config_.role);
  req.set_exit_code(status.exit_code);
  req.set_will_restart(will_restart);
  std::string message = "program " + status.Describe();
  {
    MutexLock lock(&mu_);
    if (stall_killed_incarnation_ == incarnation_ && !stall_reason_.empty()) {
      message += " after it stalled (" + stall_reason_ + ")";
    }
  }
  // A worker that ended well finished its training, stop or not; a server never finishes.
  const bool finished = config_.role == v1::ROLE_WORKER && status.exit_code == 0;
  if (stop_signal != 0 && !will_restart && !finished) {
    message += " after the agent got " + std::string(SignalName(stop_signal)) +
               " (the pod was deleted, evicted or drained)";
    if (restart_.policy == RestartPolicy::kNever) {
      message += "; restartPolicy Never does not replace it";
    } else {
      req.set_preempted(true);
      message += "; its replacement pod rejoins under this rank";
    }
  }
  req.set_message(message);
  return req;
}

void Agent::SendExitReport(const v1::ReportExitRequest& req) {
  Status s = client_->ReportExit(req);
  if (s.code() == StatusCode::kNotFound) {  // a restarted scheduler: register again, then report
    Reregister(req.rank(), req.incarnation());
    s = client_->ReportExit(req);
  }
  if (!s.ok()) TLOG_WARN << "reporting the exit to the scheduler: " << s.ToString();
}

void Agent::Reregister(int32_t rank, int64_t incarnation) {
  v1::RegisterRequest req = RegisterRequestOf(config_);
  req.set_previous_rank(rank);
  req.set_previous_incarnation(incarnation);
  {
    MutexLock lock(&mu_);
    req.set_previous_restarts(attempt_);
  }
  req.set_resume(true);
  auto resp = client_->Register(req);
  if (!resp.ok()) {
    TLOG_WARN << "registering again with the restarted scheduler: " << resp.status().ToString();
    return;
  }
  TLOG_INFO << "registered again with the restarted scheduler: " << RoleName(config_.role) << " "
            << resp->rank() << ", incarnation " << resp->incarnation() << " (the program runs on)";
  MutexLock lock(&mu_);
  if (resp->incarnation() > incarnation_) incarnation_ = resp->incarnation();
}

void Agent::KillStalled(int64_t incarnation, const std::string& reason) {
  int32_t rank;
  {
    MutexLock lock(&mu_);
    if (stall_killed_incarnation_ == incarnation) return;  // done already; its exit is on the way
    rank = rank_;
  }
  TLOG_WARN << RoleName(config_.role) << " " << rank << " (pod " << config_.pod_name
            << "): the scheduler reports its program stalled (" << reason
            << "); killing it (SIGKILL), the restart policy decides what follows";
  if (!supervisor_->KillProgram()) return;
  MutexLock lock(&mu_);
  stall_killed_incarnation_ = incarnation;
  stall_reason_ = reason;
}

void Agent::HeartbeatLoop() {
  bool failure_logged = false;
  bool unreachable = false;  // logged once per outage, not every beat
  MutexLock lock(&mu_);
  while (true) {
    const auto beat_at = std::chrono::steady_clock::now() + heartbeat_interval_;
    while (!stopping_) {
      if (!cv_.WaitUntil(&mu_, beat_at)) break;
    }
    if (stopping_) return;
    if (rank_ < 0) continue;
    int32_t rank = rank_;
    int64_t incarnation = incarnation_;
    lock.Unlock();
    std::string state(Supervisor::StateName(supervisor_->state()));
    auto resp = client_->Heartbeat(config_.role, rank, incarnation, state);
    if (!resp.ok() && resp.status().code() == StatusCode::kNotFound) {
      // Registered, yet unknown: the scheduler restarted and rebuilds the job from its members.
      unreachable = false;
      Reregister(rank, incarnation);
    } else if (!resp.ok() && resp.status().code() == StatusCode::kUnavailable) {
      if (!unreachable) {
        TLOG_WARN << "heartbeat: " << resp.status().ToString()
                  << "; the program runs on, retrying every beat";
      }
      unreachable = true;
    } else if (!resp.ok()) {
      TLOG_WARN << "heartbeat: " << resp.status().ToString();
    } else if (unreachable) {
      TLOG_INFO << "heartbeat: the scheduler answers again";
      unreachable = false;
    }
    if (resp.ok() && resp->restart_program()) KillStalled(incarnation, resp->restart_reason());
    if (resp.ok() && resp->take_over_servers_size() > 0) {
      MutexLock takeover_lock(&mu_);
      if (!stopping_) {
        if (!takeovers_) {
          takeovers_ = std::make_unique<TakeoverAgents>(config_, error_dir_.empty() ? "/tmp" : error_dir_);
        }
        takeovers_->Want({resp->take_over_servers().begin(), resp->take_over_servers().end()});
      }
    }
    if (resp.ok() && resp->job_failed() && !failure_logged) {
      TLOG_WARN << "the scheduler reports the job failed: " << resp->failure_message();
      failure_logged = true;
    }
    lock.Lock();
  }
}

}  // namespace trellis
