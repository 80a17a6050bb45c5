#include "agent/agent_config.h"

#include <gtest/gtest.h>

namespace trellis {
namespace {

std::map<std::string, std::string> GoodEnv() {
  return {{"TRELLIS_JOB", "mlp"},          {"TRELLIS_SCHEDULER", "127.0.0.1:5000"},
          {"TRELLIS_ROLE", "worker"},      {"TRELLIS_NUM_SERVERS", "2"},
          {"TRELLIS_NUM_WORKERS", "3"},    {"TRELLIS_TOKEN_FILE", "/tmp/token"}};
}

StatusOr<AgentConfig> Parse(std::vector<std::string> args, std::map<std::string, std::string> env) {
  return ParseAgentConfig(args, EnvSource(std::move(env)), "host-7");
}

void ExpectError(const StatusOr<AgentConfig>& c, const std::string& fragment) {
  ASSERT_FALSE(c.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(c.status().message().find(fragment), std::string::npos) << c.status().message();
}

TEST(AgentConfigTest, ReadsTheEnvironmentAndTheCommand) {
  auto c = Parse({"--", "train", "--epochs", "3"}, GoodEnv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->job, "mlp");
  EXPECT_EQ(c->role, v1::ROLE_WORKER);
  EXPECT_EQ(c->num_servers, 2);
  EXPECT_EQ(c->num_workers, 3);
  EXPECT_EQ(c->pod_name, "host-7");  // default: the hostname
  EXPECT_EQ(c->host, "127.0.0.1");
  EXPECT_EQ(c->command, (std::vector<std::string>{"train", "--epochs", "3"}));
  EXPECT_FALSE(c->restart_policy.has_value());  // left to the job YAML
}

TEST(AgentConfigTest, MetricsPortsAndHost) {
  auto c = Parse({"--", "train"}, GoodEnv());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->program_metrics_port.has_value());  // a free port per start
  EXPECT_FALSE(c->metrics_port.has_value());          // the agent serves nothing
  EXPECT_EQ(c->metrics_host, "0.0.0.0");
  auto env = GoodEnv();
  env["TRELLIS_METRICS_PORT"] = "9100";
  env["TRELLIS_AGENT_METRICS_PORT"] = "9101";
  env["TRELLIS_METRICS_HOST"] = "127.0.0.1";
  c = Parse({"--", "train"}, env);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->program_metrics_port, 9100);
  EXPECT_EQ(c->metrics_port, 9101);
  EXPECT_EQ(c->metrics_host, "127.0.0.1");
  env["TRELLIS_AGENT_METRICS_PORT"] = "http";
  ExpectError(Parse({"--", "train"}, env), "TRELLIS_AGENT_METRICS_PORT");
}

TEST(AgentConfigTest, FlagBeatsEnvironment) {
  auto env = GoodEnv();
  env["TRELLIS_RESTART_POLICY"] = "Always";
  env["TRELLIS_BACKOFF_LIMIT"] = "9";
  env["TRELLIS_POD_NAME"] = "mlp-worker-1";
  auto c = Parse({"--restart-policy", "ExitCode", "--backoff-limit=4", "--backoff-initial-ms", "10", "--", "x"}, env);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*c->restart_policy, RestartPolicy::kExitCode);
  EXPECT_EQ(*c->backoff_limit, 4);
  EXPECT_EQ(c->backoff_initial.count(), 10);
  EXPECT_EQ(c->pod_name, "mlp-worker-1");

  auto from_env = Parse({"--", "x"}, env);
  ASSERT_TRUE(from_env.ok());
  EXPECT_EQ(*from_env->restart_policy, RestartPolicy::kAlways);
  EXPECT_EQ(*from_env->backoff_limit, 9);
}

TEST(AgentConfigTest, MissingVariablesAreNamed) {
  for (const char* name : {"TRELLIS_JOB", "TRELLIS_SCHEDULER", "TRELLIS_ROLE", "TRELLIS_NUM_SERVERS",
                           "TRELLIS_NUM_WORKERS", "TRELLIS_TOKEN_FILE"}) {
    auto env = GoodEnv();
    env.erase(name);
    ExpectError(Parse({"--", "x"}, env), std::string("environment variable ") + name + " is not set");
  }
}

TEST(AgentConfigTest, BadValuesAreExplained) {
  auto env = GoodEnv();
  env["TRELLIS_ROLE"] = "chief";
  ExpectError(Parse({"--", "x"}, env), "TRELLIS_ROLE: must be server or worker, got 'chief'");
  env = GoodEnv();
  env["TRELLIS_NUM_WORKERS"] = "three";
  ExpectError(Parse({"--", "x"}, env), "TRELLIS_NUM_WORKERS: not an integer, got 'three'");
  env = GoodEnv();
  env["TRELLIS_NUM_WORKERS"] = "0";
  ExpectError(Parse({"--", "x"}, env), "TRELLIS_NUM_WORKERS: must be in 1..");
  env = GoodEnv();
  env["TRELLIS_SCHEDULER"] = "localhost";
  ExpectError(Parse({"--", "x"}, env), "TRELLIS_SCHEDULER: bad address 'localhost'");
  env = GoodEnv();
  env["TRELLIS_RESTART_POLICY"] = "sometimes";
  ExpectError(Parse({"--", "x"}, env), "TRELLIS_RESTART_POLICY: restart policy must be");
}

TEST(AgentConfigTest, BadFlagsAreExplained) {
  ExpectError(Parse({"--restart-policy", "Nope", "--", "x"}, GoodEnv()), "flag --restart-policy");
  ExpectError(Parse({"--backoff-limit", "-1", "--", "x"}, GoodEnv()), "flag --backoff-limit: must be in 0..");
  ExpectError(Parse({"--backoff-limit"}, GoodEnv()), "flag --backoff-limit needs a value");
  ExpectError(Parse({"--frobnicate", "--", "x"}, GoodEnv()), "unknown argument '--frobnicate'");
  ExpectError(Parse({"--backoff-initial-ms", "500", "--backoff-max-ms", "100", "--", "x"}, GoodEnv()),
              "--backoff-max-ms must be >= --backoff-initial-ms");
}

TEST(AgentConfigTest, WorkerNeedsACommandServerDoesNot) {
  ExpectError(Parse({}, GoodEnv()), "a worker needs a program");
  auto env = GoodEnv();
  env["TRELLIS_ROLE"] = "server";
  auto c = Parse({}, env);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->role, v1::ROLE_SERVER);
  EXPECT_TRUE(c->command.empty());
}

}  // namespace
}  // namespace trellis
