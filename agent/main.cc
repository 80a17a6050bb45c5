// trellis-agent: the entry point of every server and worker pod. See agent/agent_config.h.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "agent/agent.h"
#include "common/process/child_reaper.h"
#include "common/process/exit_codes.h"
#include "common/base/logging.h"
#include "common/process/termination_report.h"

int main(int argc, char** argv) {
  using namespace trellis;
  SetLogTag("agent");
  // Signals are taken by one thread (below), never by whichever thread runs; children get a
  // clean mask (common/process/subprocess.cc).
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGUSR1);  // only wakes the signal thread when the agent is done
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  // The container's termination message (common/process/termination_report.h): why the agent ended.
  const std::string termination_log = EnvSource().GetOr(kEnvTerminationLog, kDefaultTerminationLog);
  auto last_words = [&](const TerminationReport& report) {
    Status s = WriteTerminationMessage(termination_log, FormatTerminationReport(report));
    if (!s.ok()) TLOG_WARN << s.ToString();
  };
  auto failed_words = [&](const std::string& error) {
    TerminationReport report;
    report.error = error;
    last_words(report);
  };

  // PID 1 of its container: orphans of the program (and of `kubectl exec`) become the agent's
  // children. Also when it is not PID 1 (trellis-launch, a pod sharing its process namespace),
  // the program's orphans come here rather than to whoever is PID 1, and are reaped.
  if (Status s = BecomeSubreaper(); !s.ok()) TLOG_WARN << s.ToString() << "; orphans of the program go to PID 1";
  ChildReaper reaper;

  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  auto config = ParseAgentConfig(std::vector<std::string>(argv + 1, argv + argc), EnvSource(), host);
  if (!config.ok()) {
    std::fprintf(stderr, "trellis-agent: %s\n%s", config.status().message().c_str(), AgentUsage().c_str());
    failed_words("trellis-agent: " + config.status().message());
    return kExitUsage;
  }
  if (config->help) {
    std::fputs(AgentUsage().c_str(), stdout);
    return kExitOk;
  }
  SetLogTag(std::string(RoleName(config->role)) + "-agent");
  auto agent = Agent::Create(*config);
  if (!agent.ok()) {
    std::fprintf(stderr, "trellis-agent: %s\n", agent.status().ToString().c_str());
    failed_words("trellis-agent: " + agent.status().ToString());
    return agent.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitFailure;
  }

  std::atomic<bool> done{false};
  std::thread signal_thread([&] {
    while (!done.load()) {
      int sig = 0;
      if (sigwait(&sigs, &sig) != 0 || sig == SIGUSR1) continue;
      TLOG_INFO << "got " << SignalName(sig) << "; stopping the program";
      (*agent)->RequestStop(sig == SIGHUP ? SIGTERM : sig);
      if ((*agent)->NoProgramRunning()) {
        // Registering: there is no program to wait for, and the call may take a while.
        std::_Exit(kExitSignalBase + sig);
      }
    }
  });
  int code = (*agent)->Run();
  done.store(true);
  pthread_kill(signal_thread.native_handle(), SIGUSR1);
  signal_thread.join();
  last_words((*agent)->termination_report());
  return code;
}
