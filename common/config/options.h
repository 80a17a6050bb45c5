// One resolver for a program's configuration: a table of its options, each a flag and/or an
// environment variable (common/config/env_names.h), read with one precedence everywhere:
//   flag > environment > job file > default
// and one --help generated from the same table. Parsing (common/config/parse.h) and errors are
// the same in every program: "flag --port: not an integer, got 'x'", "environment variable
// TRELLIS_RANK: must be in 0..1048576, got -1".
//
//   constexpr Option kOptions[] = {
//       {"num-workers", kEnvNumWorkers, OptionType::kInt, 1, 100000, "N", "workers in the job"}, ...};
//   TRELLIS_ASSIGN_OR_RETURN(ParsedArgs args, ParseArgs(kOptions, argv_tail, {}));
//   Resolver r(kOptions, args, EnvSource());
//   TRELLIS_ASSIGN_OR_RETURN(int64_t w, r.Int("num-workers", job_file_value, /*fallback=*/1));
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/config/env.h"
#include "common/base/status.h"

namespace trellis {

enum class OptionType {
  kString,
  kInt,      // decimal integer in [min, max]
  kSeconds,  // decimal seconds in (0, max]
  kBool,     // true | false
  kOnOff,    // on | off
  kSwitch,   // a flag without a value (--keep-logs): given means true
};

// One row of a program's table. `flag` is the name without "--" (nullptr: environment only);
// `env` a constant of env_names.h (nullptr: flag only). `value` names the value in --help
// ("PORT"); `help` is one line (more lines: "\n" in it).
struct Option {
  const char* flag = nullptr;
  const char* env = nullptr;
  OptionType type = OptionType::kString;
  int64_t min = 0;
  int64_t max = 0;
  const char* value = "VALUE";
  const char* help = "";
};

// What ParseArgs accepts besides --flag VALUE and --flag=VALUE.
struct ArgsShape {
  // "--" ends the flags; what follows is a command (the agent's program).
  bool command_after_dashdash = false;
  // Arguments that are not flags (a job file; "-" too) go to ParsedArgs::positional instead of
  // being refused; then any other "-x" is an unknown flag.
  bool positional = false;
};

struct ParsedArgs {
  std::map<std::string, std::string> flags;  // name (no "--") -> value; the last one given wins
  std::vector<std::string> command;          // after "--" (ArgsShape::command_after_dashdash)
  bool dashdash = false;                     // "--" was given (the command may still be empty)
  std::vector<std::string> positional;       // in order (ArgsShape::positional)
  bool help = false;                         // -h or --help given (before any "--"): nothing else is read
};

// `args` excludes argv[0]. Errors: "unknown flag --x" (with command_after_dashdash and no
// positional: "unknown argument '--x' (the program goes after --)"), "flag --x needs a value"
// (with command_after_dashdash, "--" is never a value), "flag --x takes no value" (a kSwitch
// given "--x=v"), "unexpected argument \"x\"". A kSwitch flag's value is "true".
StatusOr<ParsedArgs> ParseArgs(std::span<const Option> table, const std::vector<std::string>& args,
                               ArgsShape shape = {});

// Reads options by their flag name (or, for environment-only rows, their variable), flag first,
// then the environment (an empty variable counts as unset), then the caller's job-file value,
// then the caller's fallback. A name not in the table is an INTERNAL error (a programming slip).
class Resolver {
 public:
  Resolver(std::span<const Option> table, const ParsedArgs& args, const EnvSource& env);

  // The raw text and where it came from; nullopt when neither the flag nor the variable is set.
  struct Raw {
    std::string text;
    std::string source;  // "flag --x" | "environment variable X"
  };
  StatusOr<std::optional<Raw>> Lookup(std::string_view name) const;

  // flag > environment > `job` > `fallback`, parsed by the row's type.
  StatusOr<std::string> String(std::string_view name, std::optional<std::string> job = std::nullopt,
                               std::string fallback = "") const;
  StatusOr<int64_t> Int(std::string_view name, std::optional<int64_t> job, int64_t fallback) const;
  StatusOr<bool> Bool(std::string_view name, std::optional<bool> job, bool fallback) const;
  StatusOr<std::chrono::milliseconds> Seconds(std::string_view name, std::optional<std::chrono::milliseconds> job,
                                              std::chrono::milliseconds fallback) const;
  // flag > environment only: nullopt when neither is set.
  StatusOr<std::optional<std::string>> OptionalString(std::string_view name) const;
  StatusOr<std::optional<int64_t>> OptionalInt(std::string_view name) const;

 private:
  StatusOr<const Option*> Find(std::string_view name) const;
  std::optional<Raw> Lookup(const Option& o) const;

  std::span<const Option> table_;
  const ParsedArgs& args_;
  const EnvSource& env_;
};

// --help: `head` (the usage line and anything before the table), then one line per option
// ("  --metrics-port PORT   /metrics and /healthz ... [TRELLIS_METRICS_PORT]"), then `tail`.
std::string HelpText(std::string_view head, std::span<const Option> table, std::string_view tail = "");

}  // namespace trellis
