// Strict, error-collecting reads of YAML mappings: the checks every field of a document needs
// (type, unknown and duplicate keys, "did you mean"), so a schema reads as a list of fields.
// Nothing here throws: yaml-cpp is only asked for what the node's type allows.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "common/base/status.h"

namespace trellis::yaml {

// Validation errors of one document, one line each: "<field path>: <what is wrong>[, got <value>]".
class Errors {
 public:
  void Add(std::string_view path, std::string_view what);
  // Appends ", got <Describe(value)>".
  void AddGot(std::string_view path, std::string_view what, const YAML::Node& value);
  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }
  // InvalidArgument with the lines joined by '\n' (at most kMaxLines, then a count of the rest).
  Status ToStatus() const;

  static constexpr size_t kMaxLines = 50;

 private:
  std::vector<std::string> lines_;
};

// How a value appears in messages: numbers, booleans and null as written (-2, true, null),
// strings in double quotes with escapes ("random"), long strings cut at 64 characters,
// collections by kind ("a sequence", "a mapping").
std::string Describe(const YAML::Node& value);
// Quotes a string the way Describe does.
std::string Quote(std::string_view s);

// "spec" + "workers" -> "spec.workers"; "" + "spec" -> "spec".
std::string JoinPath(std::string_view parent, std::string_view key);

// Scalar parsers for plain (unquoted) YAML scalars. They return nullopt on anything else,
// including quoted strings: "2" in quotes is a string, not a number.
enum class IntError { kNone, kNotInteger, kOutOfRange };
std::optional<int64_t> ParseInt(const YAML::Node& value, IntError* error = nullptr);
std::optional<double> ParseDouble(const YAML::Node& value);  // ints too; .inf / .nan too
std::optional<bool> ParseBool(const YAML::Node& value);      // true/false (any case)

// One mapping of a document, read field by field. A null or missing node reads as an empty
// mapping (Kubernetes treats null as unset). Constructing it records "must be a mapping",
// unknown keys (with a suggestion from `known`) and duplicate keys. Keys in `ignored` are
// accepted and never read.
class MapReader {
 public:
  MapReader(const YAML::Node& node, std::string path, Errors* errors,
            std::vector<std::string_view> known, std::vector<std::string_view> ignored = {});

  bool is_mapping() const { return is_mapping_; }
  const std::string& path() const { return path_; }
  std::string Path(std::string_view key) const { return JoinPath(path_, key); }
  Errors* errors() const { return errors_; }

  // The value under `key`; an undefined node when absent or null.
  YAML::Node Get(std::string_view key) const;
  bool Has(std::string_view key) const { return Get(key).IsDefined(); }

  // Typed reads: true when present and of the right type (then *out is set); false when absent
  // (out untouched) or wrong (an error is recorded). Strings accept any scalar as written.
  bool GetString(std::string_view key, std::string* out) const;
  bool GetInt(std::string_view key, int64_t* out) const;
  bool GetDouble(std::string_view key, double* out) const;  // finite numbers only
  bool GetBool(std::string_view key, bool* out) const;
  bool GetStringList(std::string_view key, std::vector<std::string>* out) const;
  bool GetStringMap(std::string_view key, std::map<std::string, std::string>* out) const;

  // One of `names` (exact spelling); the error names them all and suggests a near miss
  // (a case-insensitive match or one edit away).
  template <typename E>
  bool GetEnum(std::string_view key, const std::vector<std::pair<std::string_view, E>>& names,
               E* out) const {
    YAML::Node v = Get(key);
    if (!v.IsDefined()) return false;
    std::vector<std::string_view> allowed;
    for (const auto& [name, value] : names) {
      if (v.IsScalar() && v.Scalar() == name) {
        *out = value;
        return true;
      }
      allowed.push_back(name);
    }
    AddEnumError(Path(key), allowed, v);
    return false;
  }

 private:
  void AddEnumError(const std::string& path, const std::vector<std::string_view>& allowed,
                    const YAML::Node& value) const;

  YAML::Node node_;
  std::string path_;
  Errors* errors_;
  bool is_mapping_ = false;
};

}  // namespace trellis::yaml
