#include "launcher/command_job.h"

#include <cctype>

#include "common/config/parse.h"

namespace trellis {
namespace {

// The flag's value if given, when it is one of `values` as ToString spells them; else an error
// listing them.
template <typename E>
StatusOr<std::optional<std::string>> EnumFlag(const Resolver& r, const char* flag, std::initializer_list<E> values) {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<std::string> v, r.OptionalString(flag));
  if (!v) return v;
  std::string known;
  for (E e : values) {
    if (ToString(e) == *v) return v;
    known += (known.empty() ? "" : ", ") + std::string(ToString(e));
  }
  return InvalidArgumentError(FlagSource(flag) + ": '" + *v + "' is not one of " + known);
}

// An integer flag in its row's range (int32 rows: within int32 by their bounds).
template <typename T>
StatusOr<std::optional<T>> IntFlag(const Resolver& r, const char* flag) {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> v, r.OptionalInt(flag));
  if (!v) return std::optional<T>();
  return std::optional<T>(static_cast<T>(*v));
}

// A DNS label from the program's name: "train_cnn.py" -> "train-cnn".
std::string NameFromCommand(const std::vector<std::string>& command) {
  std::string base;
  for (const auto& a : command) {  // the script if there is one (python3 x.py), else the program
    if (a.size() > 3 && a.compare(a.size() - 3, 3, ".py") == 0) {
      base = a.substr(0, a.size() - 3);
      break;
    }
  }
  if (base.empty() && !command.empty()) base = command.front();
  if (auto slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
  std::string name;
  for (char c : base) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const bool ok = std::isalnum(static_cast<unsigned char>(l)) != 0;
    if (ok) {
      name += l;
    } else if (!name.empty() && name.back() != '-') {
      name += '-';
    }
  }
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name.size() > kMaxJobNameLength) name.resize(kMaxJobNameLength);
  while (!name.empty() && name.back() == '-') name.pop_back();
  if (name.empty() || !std::isalpha(static_cast<unsigned char>(name.front()))) name = "job-" + name;
  while (name.back() == '-') name.pop_back();
  return name;
}

}  // namespace

StatusOr<JobFlags> ReadJobFlags(const Resolver& r) {
  JobFlags f;
  TRELLIS_ASSIGN_OR_RETURN(f.workers, IntFlag<int32_t>(r, "workers"));
  TRELLIS_ASSIGN_OR_RETURN(f.servers, IntFlag<int32_t>(r, "servers"));
  TRELLIS_ASSIGN_OR_RETURN(f.name, r.OptionalString("name"));
  TRELLIS_ASSIGN_OR_RETURN(f.transport, EnumFlag(r, "transport", {Transport::kTcp, Transport::kGrpc}));
  TRELLIS_ASSIGN_OR_RETURN(f.compression,
                           EnumFlag(r, "compression", {CompressionType::kNone, CompressionType::kTwoBit}));
  TRELLIS_ASSIGN_OR_RETURN(f.server_mode, EnumFlag(r, "server-mode", {ServerMode::kAggregate, ServerMode::kUpdate}));
  TRELLIS_ASSIGN_OR_RETURN(f.restart_policy,
                           EnumFlag(r, "restart-policy",
                                    {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                                     RestartPolicy::kExitCode}));
  TRELLIS_ASSIGN_OR_RETURN(f.backoff_limit, IntFlag<int32_t>(r, "backoff-limit"));
  TRELLIS_ASSIGN_OR_RETURN(f.slice_bytes, IntFlag<int64_t>(r, "slice-bytes"));
  return f;
}

StatusOr<JobSpec> JobFromCommand(const JobFlags& flags, const std::vector<std::string>& command) {
  if (command.empty()) return InvalidArgumentError("no command after '--' (the workers' program)");
  JobSpec spec;
  spec.name = NameFromCommand(command);
  spec.image = "trellis:latest";
  spec.workers.command = command;
  return ApplyJobFlags(std::move(spec), flags);
}

StatusOr<JobSpec> ApplyJobFlags(JobSpec spec, const JobFlags& flags) {
  if (flags.name) spec.name = *flags.name;
  if (flags.workers) spec.workers.replicas = *flags.workers;
  if (flags.servers) spec.servers.replicas = *flags.servers;
  if (flags.slice_bytes) spec.sliceBytes = *flags.slice_bytes;
  if (flags.backoff_limit) spec.runPolicy.backoffLimit = *flags.backoff_limit;
  // The enums were checked by ReadJobFlags; the document's parser reads their spelling below.
  if (flags.transport) {
    spec.transport = *flags.transport == "grpc" ? Transport::kGrpc : Transport::kTcp;
  }
  if (flags.compression) {
    spec.compression.type = *flags.compression == "2bit" ? CompressionType::kTwoBit : CompressionType::kNone;
  }
  if (flags.server_mode) {
    spec.serverMode = *flags.server_mode == "update" ? ServerMode::kUpdate : ServerMode::kAggregate;
  }
  if (flags.restart_policy) {
    for (RestartPolicy p : {RestartPolicy::kNever, RestartPolicy::kOnFailure, RestartPolicy::kAlways,
                            RestartPolicy::kExitCode}) {
      if (ToString(p) == *flags.restart_policy) spec.runPolicy.restartPolicy = p;
    }
    spec.workers.restartPolicy.reset();  // the flag wins over a role's own policy too
    spec.servers.restartPolicy.reset();
  }
  // Through the one parser: the same checks (name, bounds, combinations) as a job file.
  auto parsed = ParseJobSpec(JobSpecToYaml(spec));
  if (!parsed.ok()) {
    return InvalidArgumentError("the job with these flags is not valid:\n" +
                                parsed.status().message());
  }
  return parsed;
}

}  // namespace trellis
