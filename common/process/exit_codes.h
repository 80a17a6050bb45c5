// The exit codes Trellis programs give and read, in one place: the programs' mains return them,
// the agent's supervisor and the operator's planner (operator/job_status.cc) decide restarts by
// them, without pulling in process spawning (common/process/subprocess.h).
#pragma once

namespace trellis {

inline constexpr int kExitOk = 0;
// The job or the program failed (a worker, the scheduler's server, a lost Lease).
inline constexpr int kExitFailure = 1;
// Bad flags, environment or job file: said on stderr with the usage, nothing was started.
inline constexpr int kExitUsage = 2;
// The exit code of a program that found a configuration error no restart can fix (sysexits'
// EX_CONFIG; trellis.ConfigurationError in Python): the agent and the operator never restart it.
inline constexpr int kExitConfigurationError = 78;
// A process killed by signal N exits (or is reported) with 128 + N, the shell's convention.
inline constexpr int kExitSignalBase = 128;

}  // namespace trellis
