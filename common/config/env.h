// Reading TRELLIS_* environment variables with clear errors. Configuration is read here, once,
// at a program's edge, into a struct passed down (never deep inside the code).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "common/config/env_names.h"
#include "common/config/parse.h"
#include "common/base/status.h"

namespace trellis {

// A read-only view of an environment; tests pass a map instead of the process's environ.
class EnvSource {
 public:
  // The process's environment.
  EnvSource();
  explicit EnvSource(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}

  std::optional<std::string> Get(const std::string& name) const;
  // Errors: "environment variable TRELLIS_JOB is not set" (or set but empty).
  StatusOr<std::string> Required(const std::string& name) const;
  // Unset or empty: `fallback`.
  std::string GetOr(const std::string& name, const std::string& fallback) const;
  // Integers within [min, max]; errors name the variable and the value.
  StatusOr<int64_t> RequiredInt(const std::string& name, int64_t min, int64_t max) const;
  StatusOr<std::optional<int64_t>> OptionalInt(const std::string& name, int64_t min, int64_t max) const;

  const std::map<std::string, std::string>& vars() const { return vars_; }

 private:
  std::map<std::string, std::string> vars_;
};

// The address a process's listening sockets bind (data ports, /metrics, /healthz): `specific`
// when set (e.g. TRELLIS_METRICS_HOST for /metrics), else TRELLIS_LISTEN_HOST, else every
// address ("0.0.0.0", a pod's default). trellis-launch sets TRELLIS_LISTEN_HOST=127.0.0.1, so a
// local job listens on loopback only. A flag of the program, where it has one, wins over both.
inline constexpr auto& kListenHostEnv = kEnvListenHost;  // the older spelling (tests, benchmarks)
std::string ListenHost(const EnvSource& env, const char* specific = nullptr);

// The raw-TCP data path's local socket (datapath/tcp/wire.h), for workers in the server's
// network namespace: TRELLIS_LOCAL_SOCKET "on" or "off"; unset: `unset`. trellis-pserver opens
// one only when on (trellis-launch sets it on for its jobs; pods leave it off: they share no
// network namespace); a worker uses a server's when offered unless off. Anything else is
// INVALID_ARGUMENT naming the variable.
inline constexpr auto& kLocalSocketEnv = kEnvLocalSocket;  // the older spelling (tests, benchmarks)
StatusOr<bool> LocalSocketEnabled(const EnvSource& env, bool unset);

// The process's environment as a map (for building a child's environment).
std::map<std::string, std::string> CurrentEnvironment();

}  // namespace trellis
