#include "agent/takeover_agents.h"

#include <algorithm>

#include "common/base/logging.h"
#include "common/config/env_names.h"
#include "scheduler/scheduler_client.h"

namespace trellis {

SpawnOptions TakeoverAgentSpawn(const AgentConfig& parent, int32_t rank, const std::string& self,
                                std::map<std::string, std::string> env, const std::string& termination_log) {
  SpawnOptions opts;
  opts.argv = {self, "--take-over-server", std::to_string(rank)};
  if (parent.restart_policy) {
    opts.argv.push_back("--restart-policy");
    opts.argv.push_back(std::string(ToString(*parent.restart_policy)));
  }
  if (parent.backoff_limit) {
    opts.argv.push_back("--backoff-limit");
    opts.argv.push_back(std::to_string(*parent.backoff_limit));
  }
  for (const auto& [flag, value] : {std::pair{"--backoff-initial-ms", parent.backoff_initial},
                                    std::pair{"--backoff-max-ms", parent.backoff_max},
                                    std::pair{"--stop-grace-ms", parent.stop_grace}}) {
    opts.argv.push_back(flag);
    opts.argv.push_back(std::to_string(value.count()));
  }
  if (!parent.command.empty()) {
    opts.argv.push_back("--");
    opts.argv.insert(opts.argv.end(), parent.command.begin(), parent.command.end());
  }
  env[kEnvPodName] = TakeOverPodName(parent.pod_name, rank);
  env[kEnvRole] = "server";
  env[kEnvHost] = parent.host;
  // This agent's own, not the takeover's: /metrics ports (the program's picks a free one), the
  // byte ledger, the error file, the container's termination message.
  env.erase(kEnvMetricsPort);
  env.erase(kEnvAgentMetricsPort);
  env.erase(kEnvLedgerFd);
  env.erase(kEnvLedgerSince);
  env.erase(kEnvErrorFile);
  env[kEnvTerminationLog] = termination_log;
  opts.env = std::move(env);
  return opts;
}

TakeoverAgents::TakeoverAgents(AgentConfig parent, std::string scratch)
    : parent_(std::move(parent)), scratch_(std::move(scratch)) {
  thread_ = std::thread([this] { Loop(); });
}

TakeoverAgents::~TakeoverAgents() { Stop(std::chrono::milliseconds(10000)); }

void TakeoverAgents::Want(const std::vector<int32_t>& ranks) {
  bool added = false;
  {
    MutexLock lock(&mu_);
    for (int32_t r : ranks) {
      if (agents_.count(r) != 0 || std::find(to_start_.begin(), to_start_.end(), r) != to_start_.end()) continue;
      to_start_.push_back(r);
      added = true;
    }
  }
  if (added) cv_.SignalAll();
}

void TakeoverAgents::Signal(int signo) {
  MutexLock lock(&mu_);
  for (auto& [rank, agent] : agents_) {
    if (agent && !agent->Poll().has_value()) (void)agent->Signal(signo);
  }
}

void TakeoverAgents::Stop(std::chrono::milliseconds grace) {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    grace_ = grace;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void TakeoverAgents::Loop() {
  MutexLock lock(&mu_);
  while (true) {
    // Woken by Want and Stop; every 200 ms to say which takeover agent ended.
    while (!stopping_ && to_start_.empty()) {
      if (!cv_.WaitUntil(&mu_, std::chrono::steady_clock::now() + std::chrono::milliseconds(200))) break;
    }
    for (auto& [rank, agent] : agents_) {
      if (!agent || ended_[rank]) continue;
      if (auto st = agent->Poll(); st.has_value()) {
        ended_[rank] = true;
        TLOG_WARN << "the agent of server " << rank << " (taken over by this pod) " << st->Describe();
      }
    }
    if (stopping_) break;
    std::vector<int32_t> ranks;
    ranks.swap(to_start_);
    for (int32_t rank : ranks) {
      auto dir = SelfExeDir();
      std::string self = dir.ok() ? *dir + "/trellis-agent" : "trellis-agent";
      SpawnOptions opts = TakeoverAgentSpawn(parent_, rank, self, CurrentEnvironment(),
                                             scratch_ + "/takeover-" + std::to_string(rank) + ".termination-log");
      auto agent = Subprocess::Start(opts);
      if (!agent.ok()) {
        TLOG_ERROR << "cannot start the agent of server " << rank << " this pod takes over: "
                   << agent.status().ToString();
        agents_[rank] = nullptr;  // not tried again: the rank's restart timeout fails the job
        ended_[rank] = true;
        continue;
      }
      TLOG_WARN << "taking over server " << rank << " (lost for good): its agent starts in this pod as "
                << opts.env[kEnvPodName] << ", pid " << (*agent)->pid();
      agents_[rank] = std::move(*agent);
    }
  }
  const auto grace = grace_;
  std::map<int32_t, std::unique_ptr<Subprocess>> agents;
  agents.swap(agents_);
  lock.Unlock();
  // Stopped outside the lock: each may take the grace.
  for (auto& [rank, agent] : agents) {
    if (!agent || agent->Poll().has_value()) continue;
    const ExitStatus st = agent->Stop(grace);
    TLOG_INFO << "the agent of server " << rank << " (taken over by this pod) stopped: " << st.Describe();
  }
  lock.Lock();
}

}  // namespace trellis
