#include "common/job/yaml_fields.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>

#include "common/base/edit_distance.h"
#include "common/base/text_match.h"

namespace trellis::yaml {
namespace {

constexpr size_t kMaxShown = 64;

// A plain scalar is one written without quotes or an explicit tag; yaml-cpp tags it "?".
bool IsPlain(const YAML::Node& n) { return n.IsScalar() && n.Tag() == "?"; }

// No number is longer than this; longer text is no number (and reads as "must be a number").
constexpr size_t kMaxNumberText = 1000;

bool IsIntText(const std::string& s) { return s.size() <= kMaxNumberText && text::IsIntText(s); }
bool IsFloatText(const std::string& s) { return s.size() <= kMaxNumberText && text::IsFloatText(s); }

std::optional<double> SpecialFloat(const std::string& s) {
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" || s == "+.INF") {
    return std::numeric_limits<double>::infinity();
  }
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return -std::numeric_limits<double>::infinity();
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return std::numeric_limits<double>::quiet_NaN();
  return std::nullopt;
}

bool IsBoolText(const std::string& s) {
  return s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" ||
         s == "FALSE";
}

}  // namespace

void Errors::Add(std::string_view path, std::string_view what) {
  std::string line(path);
  line += ": ";
  line += what;
  lines_.push_back(std::move(line));
}

void Errors::AddGot(std::string_view path, std::string_view what, const YAML::Node& value) {
  std::string w(what);
  w += ", got ";
  w += Describe(value);
  Add(path, w);
}

Status Errors::ToStatus() const {
  if (lines_.empty()) return Status::Ok();
  std::string m;
  for (size_t i = 0; i < lines_.size() && i < kMaxLines; ++i) {
    if (i > 0) m += '\n';
    m += lines_[i];
  }
  if (lines_.size() > kMaxLines) {
    m += "\n... and " + std::to_string(lines_.size() - kMaxLines) + " more errors";
  }
  return InvalidArgumentError(std::move(m));
}

std::string Quote(std::string_view s) {
  std::string out = "\"";
  size_t shown = 0;
  for (char c : s) {
    if (shown++ == kMaxShown) {
      out += "...";
      break;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

std::string Describe(const YAML::Node& value) {
  if (!value.IsDefined() || value.IsNull()) return "null";
  if (value.IsSequence()) return value.size() == 0 ? "an empty sequence" : "a sequence";
  if (value.IsMap()) return value.size() == 0 ? "an empty mapping" : "a mapping";
  const std::string& s = value.Scalar();
  if (IsPlain(value) && s.size() <= kMaxShown &&
      (IsFloatText(s) || SpecialFloat(s) || IsBoolText(s))) {
    return s;
  }
  return Quote(s);
}

std::string JoinPath(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string p(parent);
  p += '.';
  p += key;
  return p;
}

std::optional<int64_t> ParseInt(const YAML::Node& value, IntError* error) {
  if (error != nullptr) *error = IntError::kNotInteger;
  if (!IsPlain(value) || !IsIntText(value.Scalar())) return std::nullopt;
  const std::string& s = value.Scalar();
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(begin, s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range) {
    if (error != nullptr) *error = IntError::kOutOfRange;
    return std::nullopt;
  }
  if (ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  if (error != nullptr) *error = IntError::kNone;
  return v;
}

std::optional<double> ParseDouble(const YAML::Node& value) {
  if (!IsPlain(value)) return std::nullopt;
  const std::string& s = value.Scalar();
  if (auto special = SpecialFloat(s)) return special;
  if (!IsFloatText(s)) return std::nullopt;
  // strtod, not from_chars: the C locale is in force in every Trellis process.
  return std::strtod(s.c_str(), nullptr);
}

std::optional<bool> ParseBool(const YAML::Node& value) {
  if (!IsPlain(value) || !IsBoolText(value.Scalar())) return std::nullopt;
  return value.Scalar()[0] == 't' || value.Scalar()[0] == 'T';
}

MapReader::MapReader(const YAML::Node& node, std::string path, Errors* errors,
                     std::vector<std::string_view> known, std::vector<std::string_view> ignored)
    : path_(std::move(path)), errors_(errors) {
  if (!node.IsDefined() || node.IsNull()) return;  // absent: every field takes its default
  if (!node.IsMap()) {
    errors_->AddGot(path_.empty() ? "document" : path_, "must be a mapping", node);
    return;
  }
  node_ = node;
  is_mapping_ = true;
  std::set<std::string> seen;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;  // a copy: it->first lives in a temporary proxy
    if (!key.IsScalar()) {
      errors_->AddGot(path_.empty() ? "document" : path_, "field names must be strings", key);
      continue;
    }
    const std::string& name = key.Scalar();
    if (!seen.insert(name).second) {
      errors_->Add(Path(name), "duplicate field");
      continue;
    }
    bool ok = false;
    for (std::string_view k : known) ok = ok || k == name;
    for (std::string_view k : ignored) ok = ok || k == name;
    if (ok) continue;
    std::string what = "unknown field";
    if (auto s = SuggestName(name, known)) what += "; did you mean " + Quote(*s) + "?";
    errors_->Add(Path(name), what);
  }
}

YAML::Node MapReader::Get(std::string_view key) const {
  if (!is_mapping_) return YAML::Node(YAML::NodeType::Undefined);
  // Iterate instead of operator[]: no insertion, and the first of duplicate keys wins.
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == key) {
      if (it->second.IsNull()) break;
      return it->second;
    }
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

bool MapReader::GetString(std::string_view key, std::string* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  if (!v.IsScalar()) {
    errors_->AddGot(Path(key), "must be a string", v);
    return false;
  }
  *out = v.Scalar();
  return true;
}

bool MapReader::GetInt(std::string_view key, int64_t* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  IntError err;
  auto i = ParseInt(v, &err);
  if (!i) {
    errors_->AddGot(Path(key),
                    err == IntError::kOutOfRange ? "is out of range for a 64-bit integer"
                                                 : "must be an integer",
                    v);
    return false;
  }
  *out = *i;
  return true;
}

bool MapReader::GetDouble(std::string_view key, double* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  auto d = ParseDouble(v);
  if (!d) {
    errors_->AddGot(Path(key), "must be a number", v);
    return false;
  }
  if (!std::isfinite(*d)) {
    errors_->AddGot(Path(key), "must be a finite number", v);
    return false;
  }
  *out = *d;
  return true;
}

bool MapReader::GetBool(std::string_view key, bool* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  auto b = ParseBool(v);
  if (!b) {
    errors_->AddGot(Path(key), "must be true or false", v);
    return false;
  }
  *out = *b;
  return true;
}

bool MapReader::GetStringList(std::string_view key, std::vector<std::string>* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  if (!v.IsSequence()) {
    errors_->AddGot(Path(key), "must be a sequence of strings", v);
    return false;
  }
  std::vector<std::string> items;
  bool ok = true;
  for (size_t i = 0; i < v.size(); ++i) {
    const YAML::Node item = v[i];
    if (!item.IsScalar()) {
      errors_->AddGot(Path(key) + "[" + std::to_string(i) + "]", "must be a string", item);
      ok = false;
      continue;
    }
    items.push_back(item.Scalar());
  }
  if (ok) *out = std::move(items);
  return ok;
}

bool MapReader::GetStringMap(std::string_view key, std::map<std::string, std::string>* out) const {
  YAML::Node v = Get(key);
  if (!v.IsDefined()) return false;
  if (!v.IsMap()) {
    errors_->AddGot(Path(key), "must be a mapping of strings", v);
    return false;
  }
  std::map<std::string, std::string> items;
  bool ok = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it->first.IsScalar()) {
      errors_->AddGot(Path(key), "keys must be strings", it->first);
      ok = false;
      continue;
    }
    const std::string k = it->first.Scalar();
    if (it->second.IsNull()) {
      items.emplace(k, "");
    } else if (!it->second.IsScalar()) {
      errors_->AddGot(Path(key) + "." + k, "must be a string", it->second);
      ok = false;
    } else if (!items.emplace(k, it->second.Scalar()).second) {
      errors_->Add(Path(key) + "." + k, "duplicate field");
      ok = false;
    }
  }
  if (ok) *out = std::move(items);
  return ok;
}

void MapReader::AddEnumError(const std::string& path, const std::vector<std::string_view>& allowed,
                             const YAML::Node& value) const {
  std::string what = "must be one of ";
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) what += ", ";
    what += allowed[i];
  }
  what += ", got " + Describe(value);
  if (value.IsScalar()) {
    // Distance 1 only: enum names are short, and "Some" -> "None" would be a guess, not a fix.
    if (auto s = SuggestName(value.Scalar(), allowed, 1)) {
      what += "; did you mean " + Quote(*s) + "?";
    }
  }
  errors_->Add(path, what);
}

}  // namespace trellis::yaml
