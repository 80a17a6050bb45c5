#include "common/config/options.h"

#include <algorithm>

#include "common/config/parse.h"

namespace trellis {
namespace {

const Option* FindFlag(std::span<const Option> table, std::string_view flag) {
  for (const Option& o : table) {
    if (o.flag != nullptr && flag == o.flag) return &o;
  }
  return nullptr;
}

}  // namespace

StatusOr<ParsedArgs> ParseArgs(std::span<const Option> table, const std::vector<std::string>& args,
                               ArgsShape shape) {
  ParsedArgs out;
  // -h/--help wins over any error (up to "--": after it the arguments are the program's).
  for (const std::string& a : args) {
    if (a == "--" && shape.command_after_dashdash) break;
    if (a == "-h" || a == "--help") {
      out.help = true;
      return out;
    }
  }
  // Unknown "--x": with a command after "--" and nothing else besides flags, the likely slip is a
  // program flag before "--".
  const bool program_hint = shape.command_after_dashdash && !shape.positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--" && shape.command_after_dashdash) {
      out.dashdash = true;
      out.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (a.rfind("--", 0) != 0 || a == "--") {
      if (shape.positional && (a == "-" || a.rfind("-", 0) != 0)) {
        out.positional.push_back(a);
        continue;
      }
      if (shape.positional) return InvalidArgumentError("unknown flag " + a);
      if (program_hint) return InvalidArgumentError("unknown argument '" + a + "' (the program goes after --)");
      return InvalidArgumentError("unexpected argument \"" + a + "\"");
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Option* row = FindFlag(table, name);
    if (row == nullptr) {
      if (program_hint) return InvalidArgumentError("unknown argument '" + a + "' (the program goes after --)");
      return InvalidArgumentError("unknown flag --" + name);
    }
    if (row->type == OptionType::kSwitch) {
      if (value) return InvalidArgumentError("flag --" + name + " takes no value");
      value = "true";
    }
    if (!value) {
      if (i + 1 >= args.size() || (shape.command_after_dashdash && args[i + 1] == "--")) {
        return InvalidArgumentError("flag --" + name + " needs a value");
      }
      value = args[++i];
    }
    out.flags[name] = *value;
  }
  return out;
}

Resolver::Resolver(std::span<const Option> table, const ParsedArgs& args, const EnvSource& env)
    : table_(table), args_(args), env_(env) {}

StatusOr<const Option*> Resolver::Find(std::string_view name) const {
  for (const Option& o : table_) {
    if ((o.flag != nullptr && name == o.flag) || (o.flag == nullptr && o.env != nullptr && name == o.env)) return &o;
  }
  return InternalError("option '" + std::string(name) + "' is not in the program's table");
}

std::optional<Resolver::Raw> Resolver::Lookup(const Option& o) const {
  if (o.flag != nullptr) {
    if (auto it = args_.flags.find(o.flag); it != args_.flags.end()) return Raw{it->second, FlagSource(o.flag)};
  }
  if (o.env != nullptr) {
    if (auto v = env_.Get(o.env); v && !v->empty()) return Raw{*v, EnvSourceName(o.env)};
  }
  return std::nullopt;
}

StatusOr<std::optional<Resolver::Raw>> Resolver::Lookup(std::string_view name) const {
  TRELLIS_ASSIGN_OR_RETURN(const Option* o, Find(name));
  return Lookup(*o);
}

StatusOr<std::optional<std::string>> Resolver::OptionalString(std::string_view name) const {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<Raw> raw, Lookup(name));
  if (!raw) return std::optional<std::string>();
  return std::optional<std::string>(raw->text);
}

StatusOr<std::optional<int64_t>> Resolver::OptionalInt(std::string_view name) const {
  TRELLIS_ASSIGN_OR_RETURN(const Option* o, Find(name));
  const std::optional<Raw> raw = Lookup(*o);
  if (!raw) return std::optional<int64_t>();
  TRELLIS_ASSIGN_OR_RETURN(int64_t v, ParseInt(raw->source, raw->text, o->min, o->max));
  return std::optional<int64_t>(v);
}

StatusOr<std::string> Resolver::String(std::string_view name, std::optional<std::string> job,
                                       std::string fallback) const {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<std::string> v, OptionalString(name));
  if (v) return *v;
  return job ? *job : fallback;
}

StatusOr<int64_t> Resolver::Int(std::string_view name, std::optional<int64_t> job, int64_t fallback) const {
  TRELLIS_ASSIGN_OR_RETURN(std::optional<int64_t> v, OptionalInt(name));
  if (v) return *v;
  return job.value_or(fallback);
}

StatusOr<bool> Resolver::Bool(std::string_view name, std::optional<bool> job, bool fallback) const {
  TRELLIS_ASSIGN_OR_RETURN(const Option* o, Find(name));
  const std::optional<Raw> raw = Lookup(*o);
  if (!raw) return job.value_or(fallback);
  return o->type == OptionType::kOnOff ? ParseOnOff(raw->source, raw->text) : ParseBool(raw->source, raw->text);
}

StatusOr<std::chrono::milliseconds> Resolver::Seconds(std::string_view name,
                                                      std::optional<std::chrono::milliseconds> job,
                                                      std::chrono::milliseconds fallback) const {
  TRELLIS_ASSIGN_OR_RETURN(const Option* o, Find(name));
  const std::optional<Raw> raw = Lookup(*o);
  if (!raw) return job.value_or(fallback);
  return ParseSeconds(raw->source, raw->text, static_cast<double>(o->max));
}

std::string HelpText(std::string_view head, std::span<const Option> table, std::string_view tail) {
  constexpr size_t kColumn = 28;
  std::string out(head);
  for (const Option& o : table) {
    std::string left = o.flag == nullptr              ? "  " + std::string(o.env)
                       : o.type == OptionType::kSwitch ? "  --" + std::string(o.flag)
                                                       : "  --" + std::string(o.flag) + " " + o.value;
    std::string help = o.help;
    if (o.flag != nullptr && o.env != nullptr) help += std::string(help.empty() ? "" : " ") + "[" + o.env + "]";
    out += left;
    out += left.size() < kColumn ? std::string(kColumn - left.size(), ' ') : "\n" + std::string(kColumn, ' ');
    for (char c : help) {
      out += c;
      if (c == '\n') out += std::string(kColumn, ' ');
    }
    out += "\n";
  }
  out += tail;
  return out;
}

}  // namespace trellis
