// Elastic servers (docs/elastic.md#losing-a-server): the agents a server pod runs for the server
// ranks it took over. The scheduler names them in its heartbeat answers
// (HeartbeatResponse.take_over_servers); for each this pod's agent starts, once, one more
// trellis-agent with --take-over-server RANK, registered under TakeOverPodName(pod, RANK). That
// agent supervises the rank's program like any server's (restart policy, heartbeats, exit
// reports); its output goes where this agent's goes.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_config.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/process/subprocess.h"

namespace trellis {

// The argv and environment of the agent that takes server `rank` over for the pod `parent`
// describes: this agent's own program (`self`), its flags, and its environment (`env`) with
// the takeover's pod name and without what is this agent's alone (its /metrics ports, its
// byte ledger and error file). The takeover's termination message goes to `termination_log`,
// not the container's.
SpawnOptions TakeoverAgentSpawn(const AgentConfig& parent, int32_t rank, const std::string& self,
                                std::map<std::string, std::string> env, const std::string& termination_log);

class TakeoverAgents {
 public:
  // `scratch`: a directory of this agent's for the takeovers' termination messages.
  TakeoverAgents(AgentConfig parent, std::string scratch);
  ~TakeoverAgents();  // Stop()
  TakeoverAgents(const TakeoverAgents&) = delete;
  TakeoverAgents& operator=(const TakeoverAgents&) = delete;

  // The ranks this pod takes over now: an agent starts for each not started before (a rank
  // whose takeover agent ended is not started again: the scheduler decides what follows).
  void Want(const std::vector<int32_t>& ranks) EXCLUDES(mu_);
  // Forwards `signo` to every takeover agent still running.
  void Signal(int signo) EXCLUDES(mu_);
  // Stops every takeover agent (SIGTERM, SIGKILL after `grace`) and the thread. Idempotent.
  void Stop(std::chrono::milliseconds grace) EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  const AgentConfig parent_;
  const std::string scratch_;
  Mutex mu_;
  CondVar cv_;
  std::vector<int32_t> to_start_ GUARDED_BY(mu_);
  std::map<int32_t, std::unique_ptr<Subprocess>> agents_ GUARDED_BY(mu_);  // rank -> its agent
  std::map<int32_t, bool> ended_ GUARDED_BY(mu_);                          // rank -> exit logged
  bool stopping_ GUARDED_BY(mu_) = false;
  std::chrono::milliseconds grace_ GUARDED_BY(mu_){10000};
  // Starts the takeover agents and outlives them: their parent-death signal (SIGKILL) follows
  // this thread, so it ends only after it stopped them.
  std::thread thread_;
};

}  // namespace trellis
