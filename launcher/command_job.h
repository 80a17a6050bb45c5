// trellis-launch's command form, torchrun's habit: `trellis-launch --workers 2 --servers 1 --
// python3 train.py` builds the TrainingJob from flags instead of a file (docs/user-guide.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/config/options.h"
#include "common/job/job_spec.h"
#include "common/base/status.h"

namespace trellis {

// The job flags (each optional; unset: the TrainingJob default).
struct JobFlags {
  std::optional<int32_t> workers;
  std::optional<int32_t> servers;
  std::optional<std::string> name;
  std::optional<std::string> transport;       // tcp | grpc
  std::optional<std::string> compression;     // none | 2bit
  std::optional<std::string> restart_policy;  // Never | OnFailure | Always | ExitCode
  std::optional<int32_t> backoff_limit;
  std::optional<int64_t> slice_bytes;
  std::optional<std::string> server_mode;     // aggregate | update
  bool any() const {
    return workers || servers || name || transport || compression || restart_policy ||
           backoff_limit || slice_bytes || server_mode;
  }
};

// The job flags' rows of trellis-launch's option table (launcher/plan.cc holds the table).
inline constexpr Option kJobFlagOptions[] = {
    {"workers", nullptr, OptionType::kInt, 1, kMaxReplicas, "N", "workers (default 1)"},
    {"servers", nullptr, OptionType::kInt, 1, kMaxReplicas, "M", "parameter servers (default 1)"},
    {"name", nullptr, OptionType::kString, 0, 0, "NAME", "the job's name (default: from the script's or program's name)"},
    {"transport", nullptr, OptionType::kString, 0, 0, "tcp|grpc", "the data path (default tcp)"},
    {"compression", nullptr, OptionType::kString, 0, 0, "none|2bit", "gradient compression (default none)"},
    {"server-mode", nullptr, OptionType::kString, 0, 0, "aggregate|update",
     "servers sum the gradients or apply the optimizer (default aggregate)"},
    {"restart-policy", nullptr, OptionType::kString, 0, 0, "Never|OnFailure|Always|ExitCode",
     "every role's restart policy (default OnFailure)"},
    {"backoff-limit", nullptr, OptionType::kInt, 0, 1000000, "N", "restarts per process before the job fails (default 3)"},
    {"slice-bytes", nullptr, OptionType::kInt, kMinSliceBytes, kMaxSliceBytes, "N",
     "the largest slice of a key, in bytes (default 1048576)"},
};

// The job flags from `r`, whose table holds the rows of kJobFlagOptions; an error names the flag
// and the value ("flag --transport: 'udp' is not one of tcp, grpc").
StatusOr<JobFlags> ReadJobFlags(const Resolver& r);

// The job the command form runs: `command` (after "--") as the workers' command, the flags on
// top of the TrainingJob defaults, validated by the one job parser (so its bounds hold).
StatusOr<JobSpec> JobFromCommand(const JobFlags& flags, const std::vector<std::string>& command);
// A job file's spec with the flags on top (a flag wins over the file), validated the same way.
StatusOr<JobSpec> ApplyJobFlags(JobSpec spec, const JobFlags& flags);

}  // namespace trellis
