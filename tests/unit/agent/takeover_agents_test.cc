// The agent a server pod starts for a server rank it takes over (agent/takeover_agents.h): the
// takeover's command line, read back by the agent's own parser, runs that rank as a server
// under the takeover's pod name with this agent's flags and program, and keeps none of what is
// this agent's alone.
#include "agent/takeover_agents.h"

#include <gtest/gtest.h>

#include "common/config/env_names.h"
#include "scheduler/scheduler_client.h"

namespace trellis {
namespace {

std::map<std::string, std::string> ServerEnv() {
  return {{"TRELLIS_JOB", "mlp"},          {"TRELLIS_SCHEDULER", "10.0.0.9:5000"},
          {"TRELLIS_ROLE", "server"},      {"TRELLIS_NUM_SERVERS", "2"},
          {"TRELLIS_NUM_WORKERS", "3"},    {"TRELLIS_TOKEN_FILE", "/tmp/token"},
          {"TRELLIS_POD_NAME", "mlp-server-0"}, {"TRELLIS_HOST", "10.1.2.3"},
          {kEnvMetricsPort, "9100"},        {kEnvAgentMetricsPort, "9101"},
          {kEnvTerminationLog, "/dev/termination-log"}};
}

TEST(TakeoverAgentsTest, TheTakeoverRunsTheRankUnderItsPodNameWithThisAgentsFlags) {
  auto parent = ParseAgentConfig({"--restart-policy", "OnFailure", "--backoff-limit", "4", "--stop-grace-ms", "3000",
                                  "--", "my-pserver", "--fast"},
                                 EnvSource(ServerEnv()), "host");
  ASSERT_TRUE(parent.ok()) << parent.status().ToString();
  const SpawnOptions opts = TakeoverAgentSpawn(*parent, 1, "/opt/trellis/bin/trellis-agent", ServerEnv(),
                                               "/tmp/agent-x/takeover-1.termination-log");
  ASSERT_FALSE(opts.argv.empty());
  EXPECT_EQ(opts.argv[0], "/opt/trellis/bin/trellis-agent");
  EXPECT_EQ(opts.env.at("TRELLIS_POD_NAME"), TakeOverPodName("mlp-server-0", 1));
  EXPECT_EQ(opts.env.at("TRELLIS_HOST"), "10.1.2.3");
  EXPECT_EQ(opts.env.count(kEnvMetricsPort), 0u) << "the parent's program holds that port";
  EXPECT_EQ(opts.env.count(kEnvAgentMetricsPort), 0u);
  EXPECT_EQ(opts.env.at(kEnvTerminationLog), "/tmp/agent-x/takeover-1.termination-log")
      << "the container's termination message stays the pod's own agent's";

  // What the takeover's agent makes of it.
  auto child = ParseAgentConfig(std::vector<std::string>(opts.argv.begin() + 1, opts.argv.end()), EnvSource(opts.env),
                                "host");
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(child->take_over_server, 1);
  EXPECT_EQ(child->role, v1::ROLE_SERVER);
  EXPECT_EQ(child->pod_name, "mlp-server-0+server-1");
  EXPECT_EQ(child->scheduler_address, "10.0.0.9:5000");
  EXPECT_EQ(child->restart_policy, RestartPolicy::kOnFailure);
  EXPECT_EQ(child->backoff_limit, 4);
  EXPECT_EQ(child->stop_grace, std::chrono::milliseconds(3000));
  EXPECT_EQ(child->command, (std::vector<std::string>{"my-pserver", "--fast"}));
  EXPECT_FALSE(child->program_metrics_port.has_value()) << "a free port per start";
  EXPECT_FALSE(child->metrics_port.has_value());
}

TEST(TakeoverAgentsTest, ALongPodNameIsCutToARegistrationsLength) {
  const std::string pod(253, 'p');
  const std::string name = TakeOverPodName(pod, 12);
  EXPECT_EQ(name.size(), 253u);
  EXPECT_EQ(name.substr(name.size() - 10), "+server-12");
}

TEST(TakeoverAgentsTest, OnlyAServersAgentTakesAServerOver) {
  auto env = ServerEnv();
  env["TRELLIS_ROLE"] = "worker";
  auto c = ParseAgentConfig({"--take-over-server", "1", "--", "train"}, EnvSource(env), "host");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("only a server's agent takes a server over"), std::string::npos)
      << c.status().message();
  auto bad = ParseAgentConfig({"--take-over-server", "-1"}, EnvSource(ServerEnv()), "host");
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace trellis
