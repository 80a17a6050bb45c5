#include "launcher/plan.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace trellis {
namespace {

TEST(ParseLaunchArgsTest, FlagsAndJobFile) {
  auto o = ParseLaunchArgs({"--keep-logs", "--log-dir", "/tmp/x", "--quiet", "job.yaml"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->keep_logs);
  EXPECT_TRUE(o->quiet);
  EXPECT_EQ(o->log_dir, "/tmp/x");
  EXPECT_EQ(o->job_file, "job.yaml");
  EXPECT_EQ(ParseLaunchArgs({"--log-dir=/y", "j.yaml"})->log_dir, "/y");
  EXPECT_TRUE(ParseLaunchArgs({"--help"})->help);
  EXPECT_TRUE(ParseLaunchArgs({"-q", "j.yaml"})->quiet);
  EXPECT_EQ(ParseLaunchArgs({"-"})->job_file, "-");
  auto cmd = ParseLaunchArgs({"--", "prog", "-q", "--help"});  // the program's own flags
  ASSERT_TRUE(cmd.ok()) << cmd.status().ToString();
  EXPECT_FALSE(cmd->quiet);
  EXPECT_EQ(cmd->command, (std::vector<std::string>{"prog", "-q", "--help"}));
  auto m = ParseLaunchArgs({"--no-metrics", "--metrics-targets", "/t.json", "j.yaml"});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->metrics);
  EXPECT_EQ(m->metrics_targets, "/t.json");
  EXPECT_TRUE(ParseLaunchArgs({"j.yaml"})->metrics);
}

TEST(ParseLaunchArgsTest, ErrorsNameTheProblem) {
  auto msg = [](std::vector<std::string> a) { return ParseLaunchArgs(a).status().message(); };
  EXPECT_EQ(msg({}), "no job file given (or a command after '--')");
  EXPECT_EQ(msg({"--log-dir"}), "flag --log-dir needs a value");
  EXPECT_EQ(msg({"--log-dir=", "j.yaml"}), "flag --log-dir needs a value");
  EXPECT_EQ(msg({"--metrics-targets=", "j.yaml"}), "flag --metrics-targets needs a value");
  EXPECT_EQ(msg({"--verbose", "j.yaml"}), "unknown flag --verbose");
  EXPECT_EQ(msg({"-v", "j.yaml"}), "unknown flag -v");
  EXPECT_EQ(msg({"--keep-logs=yes", "j.yaml"}), "flag --keep-logs takes no value");
  EXPECT_EQ(msg({"a.yaml", "b.yaml"}), "one job file expected, got 'a.yaml' and 'b.yaml'");
}

// --help is generated from the option table: every row is listed (with its value's name), the
// job flags before the launcher's own options, and the exit codes.
TEST(ParseLaunchArgsTest, HelpListsEveryOptionOfTheTable) {
  const std::string help = LaunchHelp();
  EXPECT_EQ(help.rfind("usage: trellis-launch ", 0), 0u) << help;
  ASSERT_EQ(LaunchOptionTable().size(), std::size(kJobFlagOptions) + 7) << help;
  for (const Option& o : LaunchOptionTable()) {
    ASSERT_NE(o.flag, nullptr);
    const std::string listed = std::string("  --") + o.flag + (o.type == OptionType::kSwitch ? "" : std::string(" ") + o.value);
    EXPECT_TRUE(help.find(listed + " ") != std::string::npos || help.find(listed + "\n") != std::string::npos)
        << listed << "\n" << help;
    EXPECT_NE(help.find(std::string(o.help).substr(0, 20)), std::string::npos) << o.flag;
    // Every row is a flag the parser takes.
    std::vector<std::string> args = {std::string("--") + o.flag};
    if (o.type != OptionType::kSwitch) args.push_back(o.type == OptionType::kInt ? std::to_string(o.max) : "x");
    args.push_back("j.yaml");
    auto parsed = ParseLaunchArgs(args);
    EXPECT_TRUE(parsed.ok() || parsed.status().message().find("unknown flag") == std::string::npos)
        << o.flag << ": " << parsed.status().message();
  }
  for (const char* flag : {"--workers", "--servers", "--name", "--transport", "--compression", "--server-mode",
                           "--restart-policy", "--backoff-limit", "--slice-bytes", "--keep-logs", "--log-dir",
                           "--quiet", "--metrics-targets", "--no-metrics", "--listen-host", "--tls"}) {
    EXPECT_NE(help.find(std::string("  ") + flag), std::string::npos) << flag;  // the flags the docs name
  }
  EXPECT_LT(help.find("job flags"), help.find("options:"));
  EXPECT_NE(help.find("exit codes: 0 every worker succeeded"), std::string::npos);
}

JobSpec TwoByThree() {
  JobSpec job;
  job.name = "mlp";
  job.servers.replicas = 2;
  job.workers.replicas = 3;
  job.workers.command = {"trellis-test-worker"};
  job.workers.args = {"--steps", "5"};
  job.workers.env = {{"TEST_CRASH_WORKER_RANK", "1"}, {"PATH", "/override"}};
  job.workers.restartPolicy = RestartPolicy::kNever;
  job.runPolicy.restartPolicy = RestartPolicy::kExitCode;
  job.runPolicy.backoffLimit = 4;
  return job;
}

LaunchPaths Paths() {
  return LaunchPaths{"/opt/trellis/bin", "/tmp/run", "/tmp/job.yaml", "/tmp/run/token", "127.0.0.1:4000"};
}

TEST(PlanAgentsTest, OneAgentPerServerAndWorker) {
  std::map<std::string, std::string> base{{"PATH", "/usr/bin"}, {"HOME", "/root"}, {"TRELLIS_RANK", "9"}};
  auto plans = PlanAgents(TwoByThree(), Paths(), base, std::chrono::milliseconds(3000));
  ASSERT_EQ(plans.size(), 5u);
  EXPECT_EQ(plans[0].name, "server-0");
  EXPECT_EQ(plans[1].name, "server-1");
  EXPECT_EQ(plans[4].name, "worker-2");

  const ProcessPlan& server = plans[1];
  EXPECT_EQ(server.kind, ProcessPlan::Kind::kServer);
  // No server command: the agent picks trellis-pserver; the run policy applies.
  EXPECT_EQ(server.spawn.argv, (std::vector<std::string>{"/opt/trellis/bin/trellis-agent", "--restart-policy",
                                                        "ExitCode", "--backoff-limit", "4",
                                                        "--stop-grace-ms", "3000"}));
  EXPECT_EQ(server.spawn.env.at("TRELLIS_ROLE"), "server");
  EXPECT_EQ(server.spawn.env.at("TRELLIS_POD_NAME"), "mlp-server-1");
  EXPECT_EQ(server.spawn.env.at("PATH"), "/opt/trellis/bin:/usr/bin");  // siblings first
  EXPECT_EQ(server.spawn.env.count("TRELLIS_RANK"), 0u);                // the agent sets it
  EXPECT_EQ(server.spawn.env.at("HOME"), "/root");
  EXPECT_EQ(server.spawn.stdout_mode, SpawnOptions::Output::kFile);
  EXPECT_EQ(server.spawn.stdout_path, "/tmp/run/server-1.log");

  const ProcessPlan& worker = plans[3];
  EXPECT_EQ(worker.index, 1);
  EXPECT_EQ(worker.spawn.argv, (std::vector<std::string>{"/opt/trellis/bin/trellis-agent", "--restart-policy",
                                                        "Never", "--backoff-limit", "4", "--stop-grace-ms",
                                                        "3000", "--", "trellis-test-worker", "--steps", "5"}));
  const auto& env = worker.spawn.env;
  EXPECT_EQ(env.at("TRELLIS_JOB"), "mlp");
  EXPECT_EQ(env.at("TRELLIS_SCHEDULER"), "127.0.0.1:4000");
  EXPECT_EQ(env.at("TRELLIS_ROLE"), "worker");
  EXPECT_EQ(env.at("TRELLIS_NUM_SERVERS"), "2");
  EXPECT_EQ(env.at("TRELLIS_NUM_WORKERS"), "3");
  EXPECT_EQ(env.at("TRELLIS_TOKEN_FILE"), "/tmp/run/token");
  EXPECT_EQ(env.at("TRELLIS_POD_NAME"), "mlp-worker-1");
  EXPECT_EQ(env.at("TEST_CRASH_WORKER_RANK"), "1");  // the role's env entries
  EXPECT_EQ(env.at("PATH"), "/override");            // ... win over the launcher's
  EXPECT_EQ(worker.spawn.stdout_mode, SpawnOptions::Output::kPipe);
  EXPECT_EQ(worker.spawn.stderr_path, "/tmp/run/worker-1.log");
}

// An elastic job may grow beyond its first size (docs/elastic.md#growing): an agent is planned
// for every worker slot up to maxWorkers, those beyond the first size started only by a grow;
// every one of them says how many workers the job started with, and has its own metrics ports.
TEST(PlanAgentsTest, AnElasticJobGetsAnAgentPerSlotUpToMaxWorkersStartedOnGrow) {
  JobSpec job = TwoByThree();
  job.elastic = {true, 1, 5};
  ASSERT_EQ(job.WorkerSlots(), 5);
  ASSERT_EQ(MetricsPortsFor(job), 14u);
  std::vector<int> ports;
  for (int i = 0; i < 14; ++i) ports.push_back(9000 + i);
  auto plans = PlanAgents(job, Paths(), {}, std::chrono::milliseconds(3000), ports);
  ASSERT_EQ(plans.size(), 7u);
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i].start_on_grow, i >= 5) << plans[i].name;
    EXPECT_EQ(plans[i].spawn.env.at("TRELLIS_NUM_WORKERS"), "3") << plans[i].name;
  }
  EXPECT_EQ(plans[6].name, "worker-4");
  EXPECT_EQ(plans[6].spawn.env.at("TRELLIS_POD_NAME"), "mlp-worker-4");
  EXPECT_EQ(plans[6].spawn.env.at("TRELLIS_METRICS_PORT"), "9012");
  job.elastic = {true, 1, 3};  // maxWorkers the first size: nothing to start later
  EXPECT_EQ(PlanAgents(job, Paths(), {}, std::chrono::milliseconds(3000)).size(), 5u);
  job.elastic = {};
  EXPECT_EQ(job.WorkerSlots(), 3);
}

// Elastic servers (docs/elastic.md#servers): an agent for every server slot up to maxServers,
// those beyond servers.replicas started only by a server grow.
TEST(PlanAgentsTest, ElasticServersGetAnAgentPerSlotUpToMaxServersStartedOnGrow) {
  JobSpec job = TwoByThree();
  job.elastic = {true, 3, 3, 1, 4};
  ASSERT_EQ(job.ServerSlots(), 4);
  ASSERT_EQ(MetricsPortsFor(job), 14u);
  auto plans = PlanAgents(job, Paths(), {}, std::chrono::milliseconds(3000));
  ASSERT_EQ(plans.size(), 7u);
  std::vector<std::string> grown;
  for (const auto& p : plans) {
    if (p.start_on_grow) grown.push_back(p.name);
  }
  EXPECT_EQ(grown, (std::vector<std::string>{"server-2", "server-3"}));
  EXPECT_EQ(plans[3].spawn.env.at("TRELLIS_POD_NAME"), "mlp-server-3");
}

TEST(PlanSchedulerTest, PassesJobPortFileAndToken) {
  auto p = PlanScheduler(Paths(), {});
  EXPECT_EQ(p.spawn.argv, (std::vector<std::string>{"/opt/trellis/bin/trellis-scheduler", "--job-file",
                                                   "/tmp/job.yaml", "--host", "127.0.0.1", "--port", "0",
                                                   "--port-file", "/tmp/run/scheduler.port", "--token-file",
                                                   "/tmp/run/token"}));
  EXPECT_EQ(p.spawn.stdout_path, "/tmp/run/scheduler.log");
  EXPECT_EQ(p.spawn.env.at("PATH"), "/opt/trellis/bin");
}

TEST(PlanMetricsTest, EveryProcessGetsLoopbackPortsAndAFileSdTarget) {
  const JobSpec job = TwoByThree();
  ASSERT_EQ(MetricsPortsFor(job), 10u);
  std::vector<int> ports;
  for (int i = 0; i < 10; ++i) ports.push_back(9000 + i);
  std::map<std::string, std::string> base{{"TRELLIS_AGENT_METRICS_PORT", "1"}, {"TRELLIS_METRICS_HOST", "x"}};
  auto plans = PlanAgents(job, Paths(), base, std::chrono::milliseconds(3000), ports);
  ASSERT_EQ(plans.size(), 5u);
  const auto& env = plans[3].spawn.env;  // worker-1: the fourth agent, ports 9006 and 9007
  EXPECT_EQ(env.at("TRELLIS_METRICS_PORT"), "9006");
  EXPECT_EQ(env.at("TRELLIS_AGENT_METRICS_PORT"), "9007");
  EXPECT_EQ(env.at("TRELLIS_METRICS_HOST"), "127.0.0.1");
  ASSERT_EQ(plans[3].metrics.size(), 2u);
  EXPECT_EQ(plans[3].metrics[0].address, "127.0.0.1:9006");
  EXPECT_EQ(plans[3].metrics[1].labels.at("trellis_process"), "worker-1-agent");

  auto sched = PlanScheduler(Paths(), {}, "mlp", 8999);
  const auto& argv = sched.spawn.argv;
  EXPECT_EQ(std::vector<std::string>(argv.end() - 4, argv.end()),
            (std::vector<std::string>{"--metrics-host", "127.0.0.1", "--metrics-port", "8999"}));
  std::vector<const ProcessPlan*> all = {&sched, &plans[0]};
  EXPECT_EQ(FileSdTargets(all),
            "[\n"
            "  {\"targets\": [\"127.0.0.1:8999\"], \"labels\": {\"job\": \"mlp\", \"role\": \"scheduler\", "
            "\"trellis_process\": \"scheduler\"}},\n"
            "  {\"targets\": [\"127.0.0.1:9000\"], \"labels\": {\"job\": \"mlp\", \"rank\": \"0\", \"role\": "
            "\"server\", \"trellis_process\": \"server-0\"}},\n"
            "  {\"targets\": [\"127.0.0.1:9001\"], \"labels\": {\"job\": \"mlp\", \"rank\": \"0\", \"role\": "
            "\"server\", \"trellis_process\": \"server-0-agent\"}}\n"
            "]\n");

  // Without ports (--no-metrics) nothing is served and the outer environment does not leak in.
  auto bare = PlanAgents(job, Paths(), base, std::chrono::milliseconds(3000));
  EXPECT_TRUE(bare[0].metrics.empty());
  EXPECT_EQ(bare[0].spawn.env.count("TRELLIS_AGENT_METRICS_PORT"), 0u);
  EXPECT_EQ(bare[0].spawn.env.count("TRELLIS_METRICS_HOST"), 0u);
  EXPECT_TRUE(PlanScheduler(Paths(), {}).metrics.empty());
  EXPECT_EQ(FileSdTargets({}), "[\n\n]\n");
}

// --listen-host: every listener of the job (scheduler gRPC and /metrics, the servers' data ports
// and every /metrics port) binds it; the processes and Prometheus reach them there, or on
// loopback when it is 0.0.0.0. Only IPv4 literals.
TEST(PlanListenHostTest, TheFlagSetsEveryListenerAndWhereTheyAreReached) {
  EXPECT_EQ(ParseLaunchArgs({"j.yaml"})->listen_host, "127.0.0.1");
  EXPECT_EQ(ParseLaunchArgs({"--listen-host", "127.0.0.2", "j.yaml"})->listen_host, "127.0.0.2");
  EXPECT_EQ(ParseLaunchArgs({"--listen-host=0.0.0.0", "j.yaml"})->listen_host, "0.0.0.0");
  for (const std::string& bad : std::vector<std::string>{"localhost", "::1", "127.0.0.1:80", "1.2.3",
                                                          std::string(40000, '1')}) {
    auto o = ParseLaunchArgs({"--listen-host", bad, "j.yaml"});
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("--listen-host wants an IPv4 address"), std::string::npos)
        << o.status().message();
    EXPECT_LT(o.status().message().size(), 200u);
  }
  EXPECT_FALSE(ParseLaunchArgs({"--listen-host"}).ok());
  EXPECT_EQ(ParseLaunchArgs({"--listen-host", "", "j.yaml"}).status().message(), "flag --listen-host needs a value");
  EXPECT_EQ(ConnectHostFor("0.0.0.0"), "127.0.0.1");
  EXPECT_EQ(ConnectHostFor("127.0.0.2"), "127.0.0.2");

  LaunchPaths paths = Paths();
  paths.listen_host = "0.0.0.0";
  paths.connect_host = ConnectHostFor(paths.listen_host);
  const JobSpec job = TwoByThree();
  std::vector<int> ports;
  for (size_t i = 0; i < MetricsPortsFor(job); ++i) ports.push_back(9000 + static_cast<int>(i));
  auto plans = PlanAgents(job, paths, {}, std::chrono::milliseconds(3000), ports);
  const auto& env = plans[0].spawn.env;
  EXPECT_EQ(env.at("TRELLIS_LISTEN_HOST"), "0.0.0.0");
  EXPECT_EQ(env.at("TRELLIS_METRICS_HOST"), "0.0.0.0");
  EXPECT_EQ(env.at("TRELLIS_HOST"), "127.0.0.1");
  EXPECT_EQ(plans[0].metrics[0].address, "127.0.0.1:9000");
  auto sched = PlanScheduler(paths, {}, "mlp", 8999);
  const auto& argv = sched.spawn.argv;
  EXPECT_EQ(argv[std::find(argv.begin(), argv.end(), "--host") - argv.begin() + 1], "0.0.0.0");
  EXPECT_EQ(argv[std::find(argv.begin(), argv.end(), "--metrics-host") - argv.begin() + 1], "0.0.0.0");

  paths.listen_host = paths.connect_host = "127.0.0.2";
  plans = PlanAgents(job, paths, {}, std::chrono::milliseconds(3000), ports);
  EXPECT_EQ(plans[4].spawn.env.at("TRELLIS_HOST"), "127.0.0.2");
  EXPECT_EQ(plans[4].spawn.env.at("TRELLIS_LISTEN_HOST"), "127.0.0.2");
  EXPECT_EQ(plans[4].metrics[1].address, "127.0.0.2:9009");
  EXPECT_EQ(PlanScheduler(paths, {}, "mlp", 8999).metrics[0].address, "127.0.0.2:8999");
}

TEST(FailureMessageTest, NamesRoleCodeSignalRestartsAndPolicy) {
  EXPECT_EQ(FailureMessage("mlp", "worker", 1, 137, 0, RestartPolicy::kNever),
            "job mlp failed: worker 1 exited with code 137 (SIGKILL) after 0 restarts (restartPolicy Never)");
  EXPECT_EQ(FailureMessage("j", "server", 0, 3, 1, RestartPolicy::kOnFailure),
            "job j failed: server 0 exited with code 3 after 1 restart (restartPolicy OnFailure)");
}

TEST(LineSplitterTest, SplitsAcrossChunksAndCapsLongLines) {
  LineSplitter s(8);
  EXPECT_TRUE(s.Feed("hel").empty());
  EXPECT_EQ(s.Feed("lo\r\nwor"), (std::vector<std::string>{"hello"}));
  EXPECT_EQ(s.Feed("ld\n\n"), (std::vector<std::string>{"world", ""}));
  EXPECT_EQ(s.Feed("0123456789"), (std::vector<std::string>{"01234567"}));
  EXPECT_EQ(s.Flush(), "89");
  EXPECT_EQ(s.Flush(), "");
}

TEST(TailFileTest, LastLines) {
  std::string path = std::filesystem::temp_directory_path() / ("tail_test_" + std::to_string(::getpid()));
  {
    std::ofstream out(path);
    for (int i = 1; i <= 30; ++i) out << "line " << i << "\n";
  }
  EXPECT_EQ(TailFile(path, 2), "line 29\nline 30\n");
  EXPECT_EQ(TailFile(path + ".missing", 2), "");
  std::filesystem::remove(path);
}

TEST(FailureMessageTest, AKilledAgentIsSaidToHaveDied) {
  EXPECT_EQ(AgentDiedMessage("mlp", "worker", 1, 9),
            "job mlp failed: the agent of worker 1 (trellis-agent) died, killed by SIGKILL; its program went "
            "with it, and nothing restarts an agent (its restartPolicy restarts the program, not the agent)");
}

}  // namespace
}  // namespace trellis

namespace trellis {
namespace {

// TLS (docs/operations.md#tls): --tls parses; every child gets the run's TRELLIS_TLS_* and never
// an outer run's.
TEST(PlanTlsTest, EveryChildGetsTheRunsTlsFilesAndNoInheritedOnes) {
  auto o = ParseLaunchArgs({"--tls", "j.yaml"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_TRUE(o->tls);
  EXPECT_FALSE(ParseLaunchArgs({"j.yaml"})->tls);

  const std::map<std::string, std::string> outer = {{"TRELLIS_TLS_CA_FILE", "/outer/ca.crt"},
                                                    {"TRELLIS_TLS_CERT_FILE", "/outer/tls.crt"},
                                                    {"TRELLIS_TLS_KEY_FILE", "/outer/tls.key"}};
  LaunchPaths plain = Paths();
  EXPECT_EQ(PlanScheduler(plain, outer).spawn.env.count("TRELLIS_TLS_CA_FILE"), 0u);
  LaunchPaths tls = Paths();
  tls.tls = TlsFiles{"/run/tls/ca.crt", "/run/tls/tls.crt", "/run/tls/tls.key", "trellis"};
  auto sched = PlanScheduler(tls, outer);
  EXPECT_EQ(sched.spawn.env.at("TRELLIS_TLS_CA_FILE"), "/run/tls/ca.crt");
  EXPECT_EQ(sched.spawn.env.at("TRELLIS_TLS_SERVER_NAME"), "trellis");
  for (const auto& p : PlanAgents(TwoByThree(), tls, outer, std::chrono::milliseconds(3000))) {
    EXPECT_EQ(p.spawn.env.at("TRELLIS_TLS_KEY_FILE"), "/run/tls/tls.key") << p.name;
    EXPECT_EQ(p.spawn.env.at("TRELLIS_TLS_CERT_FILE"), "/run/tls/tls.crt") << p.name;
  }
}

}  // namespace
}  // namespace trellis
