#include "operator/json_util.h"

#include <ctime>
#include <exception>

namespace trellis::op {

const Json* At(const Json& v, std::initializer_list<const char*> path) {
  const Json* cur = &v;
  for (const char* key : path) {
    if (!cur->is_object()) return nullptr;
    const auto& obj = cur->as_object();
    auto it = obj.find(key);
    if (it == obj.end()) return nullptr;
    cur = &it->second;
  }
  return cur;
}

std::string Str(const Json& v, std::initializer_list<const char*> path, const std::string& def) {
  const Json* p = At(v, path);
  return p && p->is_string() ? p->as_string() : def;
}

std::optional<int64_t> Int(const Json& v, std::initializer_list<const char*> path) {
  const Json* p = At(v, path);
  if (!p || !p->is_number()) return std::nullopt;
  const auto& n = p->as_number();
  if (n.is_int64()) return n.to_int64();
  if (p->is_integer()) return std::nullopt;  // a uint64 above INT64_MAX
  const double d = p->as_double();
  // Casting a double outside the range (or NaN) is undefined behaviour.
  if (!(d > -9.2e18 && d < 9.2e18)) return std::nullopt;
  return static_cast<int64_t>(d);
}

bool Bool(const Json& v, std::initializer_list<const char*> path, bool def) {
  const Json* p = At(v, path);
  return p && p->is_boolean() ? p->as_bool() : def;
}

void Put(Json& v, std::initializer_list<const char*> path, Json value) {
  Json* cur = &v;
  size_t i = 0;
  for (const char* key : path) {
    if (!cur->is_object()) *cur = Json::object();
    if (++i == path.size()) {
      (*cur)[key] = std::move(value);
      return;
    }
    cur = &(*cur)[key];
  }
}

Json JStr(const std::string& s) { return Json::string(s); }

std::string Truncate(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max > 3 ? max - 3 : 0;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a character
  return s.substr(0, n) + "...";
}

Json JStrings(const std::initializer_list<std::string>& items) {
  Json a = Json::array();
  size_t i = 0;
  for (const auto& s : items) a[i++] = Json::string(s);
  return a;
}

std::string FormatTime(Clock::time_point t) {
  std::time_t tt = Clock::to_time_t(t);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::optional<Clock::time_point> ParseTime(const std::string& s) {
  std::tm tm{};
  const char* end = strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (end == nullptr) return std::nullopt;
  return Clock::from_time_t(timegm(&tm));
}

std::string CapJsonDepth(const std::string& text, int max_depth) {
  std::string out;
  out.reserve(text.size());
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (depth == max_depth) {
        // Skip this container up to its matching close, strings respected.
        int inner = 0;
        bool str = false;
        for (; i < text.size(); ++i) {
          const char d = text[i];
          if (str) {
            if (d == '\\') ++i;
            else if (d == '"') str = false;
          } else if (d == '"') {
            str = true;
          } else if (d == '[' || d == '{') {
            ++inner;
          } else if ((d == ']' || d == '}') && --inner == 0) {
            break;
          }
        }
        out += "\"\\u0001trellis: nested too deep\"";
        continue;
      }
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
    out += c;
  }
  return out;
}

std::optional<std::string> FindTooDeep(const Json& v) {
  if (v.is_string()) return v.as_string() == kTooDeep ? std::optional<std::string>("") : std::nullopt;
  auto join = [](const std::string& head, const std::string& tail) {
    return tail.empty() || tail[0] == '[' ? head + tail : head + "." + tail;
  };
  if (v.is_object()) {
    for (const auto& [k, item] : v.as_object()) {
      if (auto p = FindTooDeep(item)) return join(k, *p);
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (auto p = FindTooDeep(v.at(i))) return join("[" + std::to_string(i) + "]", *p);
    }
  }
  return std::nullopt;
}

std::optional<Json> ParseJson(const std::string& text, std::string* error) {
  std::error_code ec;
  Json v = Json::parse(text, ec);
  if (ec) {
    // Mostly "Nesting too deep": retry with the deep parts cut (cheap, and only on failure).
    std::error_code ec2;
    Json capped = Json::parse(CapJsonDepth(text, kMaxJsonDepth), ec2);
    if (!ec2) return capped;
    if (error) *error = ec.message();
    return std::nullopt;
  }
  return v;
}

}  // namespace trellis::op
