// What trellis-launch runs for a job, as pure functions (unit-tested without processes):
// command-line options, the scheduler and agent command lines and environments, and the
// messages a failed job prints.
#pragma once

#include <chrono>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/options.h"
#include "common/job/job_spec.h"
#include "common/base/status.h"
#include "common/process/subprocess.h"
#include "common/tls/tls.h"
#include "launcher/command_job.h"

namespace trellis {

struct LaunchOptions {
  std::string job_file;               // empty in the command form
  JobFlags job_flags;
  std::vector<std::string> command;   // after "--": the command form
  bool keep_logs = false;
  std::string log_dir;  // empty: a fresh temporary directory
  bool quiet = false;
  bool help = false;
  bool metrics = true;
  bool tls = false;  // --tls: a throwaway job CA in the run directory
  std::string listen_host = "127.0.0.1";  // --listen-host: an IPv4 literal
  std::string metrics_targets;  // empty: <run_dir>/prometheus-targets.json
  // Agents get agent_stop_grace to stop their program; the launcher waits stop_grace for an
  // agent before SIGKILL (longer, so the agent's own escalation comes first).
  std::chrono::milliseconds agent_stop_grace{3000};
  std::chrono::milliseconds stop_grace{5000};
  std::chrono::milliseconds scheduler_start_timeout{30000};
};

// Where the job's processes reach a listener bound to `listen_host` (an IPv4 literal).
std::string ConnectHostFor(const std::string& listen_host);

// trellis-launch's option table: the job flags (kJobFlagOptions) then the launcher's own; one
// resolver reads it (common/config/options.h) and --help is generated from it.
std::span<const Option> LaunchOptionTable();
// --help: the usage, the table's rows (job flags, then options) and the exit codes.
std::string LaunchHelp();

// `args` excludes argv[0]. Errors name the flag (the common form of common/config/parse.h).
StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);

struct LaunchPaths {
  std::string bin_dir;            // where trellis-scheduler and trellis-agent live
  std::string run_dir;            // logs, token, port file
  std::string job_file;           // absolute path of the job file
  std::string token_file;
  std::string scheduler_address;  // host:port, once known
  // Every listening socket of the job binds listen_host; the processes reach each other (and
  // Prometheus them) at connect_host: the same address, or loopback when it is 0.0.0.0.
  std::string listen_host = "127.0.0.1";
  std::string connect_host = "127.0.0.1";
  TlsFiles tls;                   // absolute paths; off: plaintext (TRELLIS_TLS_* to every child)
};

// One /metrics endpoint for Prometheus file service discovery.
struct MetricsTarget {
  std::string address;                        // "127.0.0.1:port"
  std::map<std::string, std::string> labels;  // job, role, rank, trellis_process
};

// One process the launcher starts.
struct ProcessPlan {
  std::string name;  // "scheduler", "server-0", "worker-2"
  enum class Kind { kScheduler, kServer, kWorker } kind = Kind::kWorker;
  int index = 0;
  SpawnOptions spawn;
  std::vector<MetricsTarget> metrics;  // its /metrics endpoints (program, agent)
  // An elastic job's worker slot beyond its first size: started only when a grow brings it in.
  bool start_on_grow = false;
};

// `base_env`: the launcher's environment; the children get it with bin_dir first on PATH.
// `metrics_port` >= 0: the scheduler serves /metrics there on paths.listen_host.
ProcessPlan PlanScheduler(const LaunchPaths& paths, const std::map<std::string, std::string>& base_env,
                          const std::string& job = "", int metrics_port = -1);
// One agent per server and per worker slot (JobSpec::WorkerSlots): role env entries added, the
// role's command after "--", restart policy and backoffLimit from the job. Workers' stdout is a
// pipe (passed through with a prefix); everything else goes to <run_dir>/<name>.log.
std::vector<ProcessPlan> PlanAgents(const JobSpec& job, const LaunchPaths& paths,
                                    const std::map<std::string, std::string>& base_env,
                                    std::chrono::milliseconds agent_stop_grace,
                                    const std::vector<int>& metrics_ports = {});
// Ports PlanAgents wants: two per agent (its program's /metrics, the agent's own).
inline size_t MetricsPortsFor(const JobSpec& job) {
  return 2 * static_cast<size_t>(job.ServerSlots() + job.WorkerSlots());
}

// The Prometheus file-SD document (JSON) listing every endpoint of `plans`.
std::string FileSdTargets(const std::vector<const ProcessPlan*>& plans);

// "job mlp failed: worker 1 exited with code 137 (SIGKILL) after 0 restarts (restartPolicy Never)"
// When the agent itself was killed (by a signal: an agent otherwise exits with its program's
// code), its program's exit is unknown: the message says the agent died, not "exited after 0
// restarts".
std::string AgentDiedMessage(const std::string& job, std::string_view role, int index, int signal);
std::string FailureMessage(const std::string& job, std::string_view role, int index, int exit_code,
                           int restarts, RestartPolicy policy);

// Splits a byte stream into lines ('\n'; a trailing '\r' is dropped). Lines longer than
// max_line are cut so a program that never prints a newline cannot grow memory without bound.
class LineSplitter {
 public:
  explicit LineSplitter(size_t max_line = 64 * 1024) : max_line_(max_line) {}
  std::vector<std::string> Feed(std::string_view bytes);
  // The unterminated rest (at end of stream); empty if none.
  std::string Flush();

 private:
  size_t max_line_;
  std::string partial_;
};

// The last `n` lines of a file ("" when unreadable).
std::string TailFile(const std::string& path, int n);

}  // namespace trellis
