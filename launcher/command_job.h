// trellis-launch's command form, torchrun's habit: `trellis-launch --workers 2 --servers 1 --
// python3 train.py` builds the TrainingJob from flags instead of a file (docs/user-guide.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/status.h"

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

// Consumes a job flag at args[*i] ("--workers 2" or "--workers=2"), advancing *i past its
// value. Returns false when args[*i] is not a job flag; an error names the flag and the value.
StatusOr<bool> ParseJobFlag(const std::vector<std::string>& args, size_t* i, JobFlags* flags);

// The job the command form runs: `command` (after "--") as the workers' command, the flags on
// top of the TrainingJob defaults, validated by the one job parser (so its bounds hold).
StatusOr<JobSpec> JobFromCommand(const JobFlags& flags, const std::vector<std::string>& command);
// A job file's spec with the flags on top (a flag wins over the file), validated the same way.
StatusOr<JobSpec> ApplyJobFlags(JobSpec spec, const JobFlags& flags);

}  // namespace trellis
