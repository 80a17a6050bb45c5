#include "common/config/env.h"

extern char** environ;

namespace trellis {

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    out.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return out;
}

EnvSource::EnvSource() : vars_(CurrentEnvironment()) {}

std::optional<std::string> EnvSource::Get(const std::string& name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

StatusOr<std::string> EnvSource::Required(const std::string& name) const {
  auto v = Get(name);
  if (!v) return InvalidArgumentError(EnvSourceName(name) + " is not set");
  if (v->empty()) return InvalidArgumentError(EnvSourceName(name) + " is empty");
  return *v;
}

std::string EnvSource::GetOr(const std::string& name, const std::string& fallback) const {
  auto v = Get(name);
  return v && !v->empty() ? *v : fallback;
}

StatusOr<int64_t> EnvSource::RequiredInt(const std::string& name, int64_t min, int64_t max) const {
  TRELLIS_ASSIGN_OR_RETURN(std::string v, Required(name));
  return ParseInt(EnvSourceName(name), v, min, max);
}

StatusOr<std::optional<int64_t>> EnvSource::OptionalInt(const std::string& name, int64_t min, int64_t max) const {
  auto v = Get(name);
  if (!v || v->empty()) return std::optional<int64_t>();
  TRELLIS_ASSIGN_OR_RETURN(int64_t n, ParseInt(EnvSourceName(name), *v, min, max));
  return std::optional<int64_t>(n);
}

std::string ListenHost(const EnvSource& env, const char* specific) {
  if (specific != nullptr) {
    if (auto v = env.Get(specific); v && !v->empty()) return *v;
  }
  return env.GetOr(kEnvListenHost, "0.0.0.0");
}

StatusOr<bool> LocalSocketEnabled(const EnvSource& env, bool unset) {
  return ParseOnOff(EnvSourceName(kEnvLocalSocket),
                    env.GetOr(kEnvLocalSocket, unset ? "on" : "off"));
}

}  // namespace trellis
