// The agent: registers its pod with the scheduler, starts the role's program with the cluster
// described in its environment, supervises it (agent/supervisor.h), heartbeats, reports exits.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "agent/agent_config.h"
#include "agent/process_group.h"
#include "agent/supervisor.h"
#include "agent/takeover_agents.h"
#include "common/base/mutex.h"
#include "common/process/byte_ledger.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_http.h"
#include "common/process/subprocess.h"
#include "common/process/termination_report.h"
#include "scheduler/scheduler_client.h"

namespace trellis {

// Why a program of `role` and `rank` that ended well is outside the world of `view` (a resize
// took it out: InTheWorld), or "" when it is inside.
std::string OutsideTheWorld(const v1::ClusterView& view, v1::Role role, int32_t rank);

class Agent : public SupervisorHooks {
 public:
  // Reads the token, connects, fetches the job's settings (heartbeat interval, restart policy
  // when no flag or environment variable set one). Errors: unreadable token file.
  static StatusOr<std::unique_ptr<Agent>> Create(AgentConfig config);
  ~Agent() override;

  // Supervises the program to the end; returns the agent's exit code (the program's last code,
  // 1 when registration failed). Call from the main thread.
  int Run() EXCLUDES(mu_);

  // Any thread (the signal thread): forward `signo` and stop. SIGTERM (the pod is being
  // deleted, evicted, drained) first asks the scheduler whether the whole job is being stopped
  // (AwaitTheJobsStop).
  void RequestStop(int signo) EXCLUDES(mu_);
  // True while no program runs (registering): a stop can then end the agent at once.
  bool NoProgramRunning() const;

  const RestartOptions& restart_options() const { return restart_; }
  // Why the agent ended, for the container's termination message (common/process/termination_report.h).
  // Complete once Run() returned.
  const TerminationReport& termination_report() const { return report_; }

  // SupervisorHooks
  StatusOr<SpawnOptions> PrepareStart(int attempt) override EXCLUDES(mu_);
  void OnStarted(const Process& process, int attempt) override;
  void OnStartFailed(const Status& error, int attempt) override;
  bool MayRestart(const ExitStatus& status) override EXCLUDES(mu_);
  void OnExit(const ExitStatus& status, bool will_restart, int restarts) override EXCLUDES(mu_);

 private:
  Agent(AgentConfig config, std::unique_ptr<SchedulerClient> client);
  StatusOr<v1::RegisterResponse> RegisterWithRetry(int attempt) EXCLUDES(mu_);
  // Its pod is being stopped from outside: while the scheduler says the whole job is being
  // stopped and rank 0's exit checkpoint is not written yet, the program runs on (asked every
  // 200 ms; scheduler/pod_stops.h). Returns at once when only this pod is stopped (within the
  // job's short window), or when the scheduler does not answer.
  void AwaitTheJobsStop() EXCLUDES(mu_);
  // The scheduler does not know this pod although it registered (the scheduler restarted):
  // register again under the rank and incarnation held, the program running on.
  void Reregister(int32_t rank, int64_t incarnation) EXCLUDES(mu_);
  StatusOr<std::vector<std::string>> ProgramArgv() const;
  void HeartbeatLoop() EXCLUDES(mu_);
  // The scheduler says the program stalled: kill it (once per incarnation); the restart policy
  // decides what follows.
  void KillStalled(int64_t incarnation, const std::string& reason) EXCLUDES(mu_);
  // Fills the exit report: a stop from outside under a policy that replaces the pod is a
  // preemption (the replacement pod rejoins), not a failure; see ReportExitRequest.preempted.
  v1::ReportExitRequest ExitReport(const ExitStatus& status, bool will_restart) EXCLUDES(mu_);
  // ReportExit; a restarted scheduler that does not know us yet (NOT_FOUND) gets a
  // registration first.
  void SendExitReport(const v1::ReportExitRequest& req) EXCLUDES(mu_);
  // Fills report_ from how supervision ended: asks the scheduler whether the job failed when the
  // program failed for good (a replacement pod could not join it then).
  void FinishReport(const SupervisorResult& r, int32_t rank);
  // Processes per pod: a worker with gpusPerWorker (TRELLIS_GPUS) > 1 runs one per GPU.
  int LocalSize() const { return config_.role == v1::ROLE_WORKER && config_.gpus > 1 ? config_.gpus : 1; }
  // Once the rank is known (the first registration): the agent's series and their server.
  Status StartMetrics(int32_t rank);
  // Makes error_dir_ for the program's $TRELLIS_ERROR_FILE. Errors: the directory cannot be made.
  Status MakeErrorDir();
  // What the last program left in its error file (common/process/termination_report.h ReadProgramError);
  // removes the file. "" when there is none.
  std::string TakeProgramError();

  const AgentConfig config_;
  std::unique_ptr<SchedulerClient> client_;
  RestartOptions restart_;
  std::chrono::milliseconds heartbeat_interval_{1000};
  std::chrono::milliseconds registration_timeout_{300000};
  // One child, or a multi-GPU worker pod's G local processes as one group (process_group.h).
  std::unique_ptr<ProcessSpawner> spawner_;
  RealBackoffTimer timer_;
  std::unique_ptr<Supervisor> supervisor_;
  // Supervisor thread only (PrepareStart, OnStarted, OnStartFailed), then Run's.
  std::string program_;       // argv[0] of the last start
  Status last_start_error_;   // why the last start failed; ok: it started
  TerminationReport report_;  // filled by Run
  // The program's $TRELLIS_ERROR_FILE: <error_dir_>/program-error, in a directory of the agent's
  // own (mode 0700, removed with the agent); emptied before every start. Empty: none could be made.
  std::string error_dir_;
  std::string error_file_;

  mutable Mutex mu_;
  CondVar cv_;  // wakes the heartbeat thread and registration retries
  bool stopping_ GUARDED_BY(mu_) = false;
  // The signal that stopped the agent from outside (RequestStop; on Kubernetes the pod's
  // deletion or eviction); 0: none.
  int stop_signal_ GUARDED_BY(mu_) = 0;
  bool final_exit_reported_ GUARDED_BY(mu_) = false;  // ReportExit without will_restart sent
  int32_t rank_ GUARDED_BY(mu_) = -1;                 // -1 until registered
  int64_t incarnation_ GUARDED_BY(mu_) = 0;
  int attempt_ GUARDED_BY(mu_) = 0;  // restarts of the program so far
  // The scheduler said this pod's worker rank finished already (RegisterResponse.finished): the
  // agent runs nothing and exits 0. -1: not so.
  int32_t finished_rank_ GUARDED_BY(mu_) = -1;
  // The scheduler found the program stalled (HeartbeatResponse.restart_program) and the agent
  // killed it: the incarnation killed and why, for the exit report. 0: none.
  int64_t stall_killed_incarnation_ GUARDED_BY(mu_) = 0;
  std::string stall_reason_ GUARDED_BY(mu_);

  // Made on the first registration (labels need the rank), then only read. Only touched from
  // the supervisor's thread (PrepareStart, OnExit).
  std::unique_ptr<MetricsRegistry> metrics_;
  prometheus::Counter* restarts_ = nullptr;
  prometheus::Counter* exits_ = nullptr;
  prometheus::Gauge* program_up_ = nullptr;
  // A single-process worker's byte counts across its program's restarts (common/process/byte_ledger.h);
  // null for servers, multi-GPU pods, or when memfd is not available. Made in Create, then
  // touched only from the supervisor's thread.
  std::unique_ptr<ByteLedger> ledger_;
  int64_t ledger_since_ = 0;  // the incarnation of the first program it counted; 0: none yet
  // Elastic servers: the agents this server pod runs for ranks it took over, made on the first
  // heartbeat answer that names one (agent/takeover_agents.h); stopped when Run ends.
  std::unique_ptr<TakeoverAgents> takeovers_ GUARDED_BY(mu_);
  std::unique_ptr<MetricsHttpServer> metrics_server_;  // declared last: stops first
  std::thread heartbeat_thread_;
};

}  // namespace trellis
