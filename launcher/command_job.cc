#include "launcher/command_job.h"

#include <cctype>
#include <charconv>

namespace trellis {
namespace {

// One of `values`, as ToString spells it; else an error listing them.
template <typename E>
StatusOr<E> ParseEnum(const std::string& flag, const std::string& v, std::initializer_list<E> values) {
  std::string known;
  for (E e : values) {
    if (ToString(e) == v) return e;
    known += (known.empty() ? "" : ", ") + std::string(ToString(e));
  }
  return InvalidArgumentError("flag " + flag + ": '" + v + "' is not one of " + known);
}

template <typename T>
StatusOr<T> ParseInt(const std::string& flag, const std::string& v, T lo, T hi) {
  T out{};
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size()) {
    return InvalidArgumentError("flag " + flag + " needs an integer, got '" + v + "'");
  }
  if (out < lo || out > hi) {
    return InvalidArgumentError("flag " + flag + " must be in [" + std::to_string(lo) + ", " +
                                std::to_string(hi) + "], got " + v);
  }
  return out;
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

StatusOr<bool> ParseJobFlag(const std::vector<std::string>& args, size_t* i, JobFlags* flags) {
  static const char* const kFlags[] = {"--workers", "--servers", "--name", "--transport",
                                       "--compression", "--restart-policy", "--backoff-limit",
                                       "--slice-bytes", "--server-mode"};
  const std::string& a = args[*i];
  std::string flag, value;
  bool have_value = false;
  for (const char* f : kFlags) {
    const std::string fs = f;
    if (a == fs) {
      flag = fs;
    } else if (a.rfind(fs + "=", 0) == 0) {
      flag = fs;
      value = a.substr(fs.size() + 1);
      have_value = true;
    }
  }
  if (flag.empty()) return false;
  if (!have_value) {
    if (*i + 1 >= args.size() || args[*i + 1] == "--") {
      return InvalidArgumentError("flag " + flag + " needs a value");
    }
    value = args[++*i];
  }
  if (value.empty()) return InvalidArgumentError("flag " + flag + " needs a value");
  if (flag == "--workers") {
    TRELLIS_ASSIGN_OR_RETURN(flags->workers, ParseInt<int32_t>(flag, value, 1, kMaxReplicas));
  } else if (flag == "--servers") {
    TRELLIS_ASSIGN_OR_RETURN(flags->servers, ParseInt<int32_t>(flag, value, 1, kMaxReplicas));
  } else if (flag == "--backoff-limit") {
    TRELLIS_ASSIGN_OR_RETURN(flags->backoff_limit, ParseInt<int32_t>(flag, value, 0, 1000000));
  } else if (flag == "--slice-bytes") {
    TRELLIS_ASSIGN_OR_RETURN(flags->slice_bytes,
                             ParseInt<int64_t>(flag, value, kMinSliceBytes, kMaxSliceBytes));
  } else if (flag == "--name") {
    flags->name = value;
  } else if (flag == "--transport") {
    TRELLIS_RETURN_IF_ERROR(
        ParseEnum(flag, value, {Transport::kTcp, Transport::kGrpc}).status());
    flags->transport = value;
  } else if (flag == "--compression") {
    TRELLIS_RETURN_IF_ERROR(
        ParseEnum(flag, value, {CompressionType::kNone, CompressionType::kTwoBit}).status());
    flags->compression = value;
  } else if (flag == "--restart-policy") {
    TRELLIS_RETURN_IF_ERROR(ParseEnum(flag, value,
                                      {RestartPolicy::kNever, RestartPolicy::kOnFailure,
                                       RestartPolicy::kAlways, RestartPolicy::kExitCode})
                                .status());
    flags->restart_policy = value;
  } else if (flag == "--server-mode") {
    TRELLIS_RETURN_IF_ERROR(
        ParseEnum(flag, value, {ServerMode::kAggregate, ServerMode::kUpdate}).status());
    flags->server_mode = value;
  }
  return true;
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
  // The enums were checked by ParseJobFlag; the document's parser reads their spelling below.
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
