// The configuration resolver (common/config/options.h): flag > environment > job file > default,
// errors that name the flag or the variable, and --help generated from the same table.
#include "common/config/options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/config/env_names.h"

namespace trellis {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr Option kTable[] = {
    {"num-workers", kEnvNumWorkers, OptionType::kInt, 1, 100000, "N", "workers in the job"},
    {"port", nullptr, OptionType::kInt, 0, 65535, "PORT", "the gRPC port (0 picks one)"},
    {"job-name", kEnvJob, OptionType::kString, 0, 0, "NAME", "the job's name"},
    {"local-socket", kEnvLocalSocket, OptionType::kOnOff, 0, 0, "on|off", "a Unix socket too"},
    {"leader-elect", nullptr, OptionType::kBool, 0, 0, "true|false", "hold the Lease first"},
    {"heartbeat-timeout", nullptr, OptionType::kSeconds, 0, 86400, "SECONDS", "declare a node dead\nafter this"},
    {nullptr, kEnvGpus, OptionType::kInt, 0, 1024, "", "GPUs per worker"},
};

using Vars = std::map<std::string, std::string>;

ParsedArgs Args(std::vector<std::string> args, ArgsShape shape = {}) {
  auto a = ParseArgs(kTable, args, shape);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? *a : ParsedArgs{};
}

TEST(ResolverTest, FlagBeatsEnvironmentBeatsJobFileBeatsDefault) {
  const EnvSource env(Vars{{"TRELLIS_NUM_WORKERS", "3"}, {"TRELLIS_JOB", "from-env"}});
  const ParsedArgs none = Args({});
  const ParsedArgs flags = Args({"--num-workers", "5", "--job-name=from-flag"});
  Resolver with_flags(kTable, flags, env);
  EXPECT_EQ(*with_flags.Int("num-workers", 7, 1), 5);
  EXPECT_EQ(*with_flags.String("job-name", "from-job", "default"), "from-flag");
  Resolver from_env(kTable, none, env);
  EXPECT_EQ(*from_env.Int("num-workers", 7, 1), 3);
  EXPECT_EQ(*from_env.String("job-name", "from-job", "default"), "from-env");
  const EnvSource empty_env(Vars{{"TRELLIS_NUM_WORKERS", ""}});  // set but empty: unset
  Resolver from_job(kTable, none, empty_env);
  EXPECT_EQ(*from_job.Int("num-workers", 7, 1), 7);
  EXPECT_EQ(*from_job.String("job-name", "from-job", "default"), "from-job");
  EXPECT_EQ(*from_job.Int("num-workers", std::nullopt, 1), 1);
  EXPECT_EQ(*from_job.String("job-name"), "");
  EXPECT_EQ(*from_job.OptionalInt("num-workers"), std::nullopt);
}

TEST(ResolverTest, EveryTypeIsParsedByItsRow) {
  const EnvSource env(Vars{{"TRELLIS_LOCAL_SOCKET", "on"}, {"TRELLIS_GPUS", "2"}});
  const ParsedArgs a = Args({"--leader-elect", "true", "--heartbeat-timeout", "1.5", "--port", "0"});
  Resolver r(kTable, a, env);
  EXPECT_TRUE(*r.Bool("local-socket", std::nullopt, false));
  EXPECT_TRUE(*r.Bool("leader-elect", std::nullopt, false));
  EXPECT_EQ(*r.Seconds("heartbeat-timeout", std::nullopt, 10s), 1500ms);
  EXPECT_EQ(*r.Int("port", std::nullopt, 50051), 0);
  EXPECT_EQ(*r.Int(kEnvGpus, std::nullopt, 0), 2);  // environment-only rows go by their variable
  EXPECT_EQ(r.Int("no-such-option", std::nullopt, 0).status().code(), StatusCode::kInternal);
}

TEST(ResolverTest, BadValuesNameTheFlagOrTheVariable) {
  const EnvSource env(Vars{{"TRELLIS_NUM_WORKERS", "three"}, {"TRELLIS_LOCAL_SOCKET", "maybe"}, {"TRELLIS_GPUS", "-1"}});
  const ParsedArgs none = Args({});
  Resolver from_env(kTable, none, env);
  EXPECT_EQ(from_env.Int("num-workers", std::nullopt, 1).status().message(),
            "environment variable TRELLIS_NUM_WORKERS: not an integer, got 'three'");
  EXPECT_EQ(from_env.Bool("local-socket", std::nullopt, false).status().message(),
            "environment variable TRELLIS_LOCAL_SOCKET: must be on or off, got 'maybe'");
  EXPECT_EQ(from_env.Int(kEnvGpus, std::nullopt, 0).status().message(),
            "environment variable TRELLIS_GPUS: must be in 0..1024, got -1");
  const ParsedArgs flags = Args({"--num-workers=0", "--leader-elect", "yes", "--heartbeat-timeout", "0"});
  Resolver from_flags(kTable, flags, env);
  EXPECT_EQ(from_flags.Int("num-workers", std::nullopt, 1).status().message(),
            "flag --num-workers: must be in 1..100000, got 0");
  EXPECT_EQ(from_flags.Bool("leader-elect", std::nullopt, false).status().message(),
            "flag --leader-elect: must be true or false, got 'yes'");
  EXPECT_EQ(from_flags.Seconds("heartbeat-timeout", std::nullopt, 1s).status().message(),
            "flag --heartbeat-timeout: must be seconds in (0, 86400], got '0'");
}

TEST(ParseArgsTest, ShapesAndErrors) {
  auto msg = [](std::vector<std::string> a, ArgsShape shape = {}) { return ParseArgs(kTable, a, shape).status().message(); };
  EXPECT_EQ(msg({"--frobnicate", "1"}), "unknown flag --frobnicate");
  EXPECT_EQ(msg({"--port"}), "flag --port needs a value");
  EXPECT_EQ(msg({"job.yaml"}), "unexpected argument \"job.yaml\"");
  EXPECT_EQ(msg({"--gpus", "1"}), "unknown flag --gpus");  // an environment-only row has no flag
  EXPECT_EQ(msg({"--frobnicate", "--", "x"}, {.command_after_dashdash = true}),
            "unknown argument '--frobnicate' (the program goes after --)");
  auto a = ParseArgs(kTable, {"--port", "1", "--port=2", "--", "python", "--port", "3"}, {.command_after_dashdash = true});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->flags.at("port"), "2");  // the last one given wins
  EXPECT_EQ(a->command, (std::vector<std::string>{"python", "--port", "3"}));
  EXPECT_TRUE(ParseArgs(kTable, {"--frobnicate", "--port", "1", "-h"})->help);  // help wins over errors
  EXPECT_TRUE(ParseArgs(kTable, {"--help"})->help);
  auto program_help = ParseArgs(kTable, {"--", "python", "--help"}, {.command_after_dashdash = true});
  EXPECT_FALSE(program_help->help);  // the program's own --help
  EXPECT_EQ(program_help->command, (std::vector<std::string>{"python", "--help"}));
}

// A program with a positional argument and switches (trellis-launch: [FLAGS] JOB.yaml | -- COMMAND).
constexpr Option kSwitchTable[] = {
    {"keep-logs", nullptr, OptionType::kSwitch, 0, 0, "", "keep the logs"},
    {"workers", nullptr, OptionType::kInt, 1, 10, "N", "workers"},
};

TEST(ParseArgsTest, SwitchesAndPositionalArguments) {
  const ArgsShape shape{.command_after_dashdash = true, .positional = true};
  auto a = ParseArgs(kSwitchTable, {"--keep-logs", "job.yaml", "-", "--workers", "2"}, shape);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->flags.at("keep-logs"), "true");
  EXPECT_EQ(a->positional, (std::vector<std::string>{"job.yaml", "-"}));
  EXPECT_FALSE(a->dashdash);
  const Resolver r(kSwitchTable, *a, EnvSource(Vars{}));
  EXPECT_TRUE(*r.Bool("keep-logs", std::nullopt, false));
  auto c = ParseArgs(kSwitchTable, {"--workers", "2", "--"}, shape);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->dashdash);  // "--" with nothing after it: the program may call that an error
  EXPECT_TRUE(c->command.empty());
  auto msg = [&](std::vector<std::string> args) { return ParseArgs(kSwitchTable, args, shape).status().message(); };
  EXPECT_EQ(msg({"--keep-logs=yes"}), "flag --keep-logs takes no value");
  EXPECT_EQ(msg({"--verbose", "j.yaml"}), "unknown flag --verbose");
  EXPECT_EQ(msg({"-v", "j.yaml"}), "unknown flag -v");
  EXPECT_EQ(msg({"--workers", "--", "p"}), "flag --workers needs a value");  // "--" is never a value
  const std::string help = HelpText("", kSwitchTable);
  EXPECT_THAT(help, HasSubstr("  --keep-logs               keep the logs\n"));  // no value to name
}

TEST(HelpTextTest, ListsEveryOptionOfTheTableWithItsVariable) {
  const std::string help = HelpText("usage: prog [FLAGS]\n", kTable, "the end\n");
  EXPECT_EQ(help.rfind("usage: prog [FLAGS]\n", 0), 0u);
  for (const Option& o : kTable) {
    if (o.flag != nullptr) {
      EXPECT_THAT(help, HasSubstr(std::string("--") + o.flag + " " + o.value)) << o.flag;
    }
    if (o.env != nullptr) {
      EXPECT_THAT(help, HasSubstr(o.env));
    }
    EXPECT_THAT(help, HasSubstr(std::string(o.help).substr(0, 10)));
  }
  EXPECT_THAT(help, HasSubstr("  --num-workers N           workers in the job [TRELLIS_NUM_WORKERS]\n"));
  EXPECT_THAT(help, HasSubstr("declare a node dead\n                            after this\n"));
  EXPECT_THAT(help, HasSubstr("the end\n"));
}

}  // namespace
}  // namespace trellis
