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
  if (p->is_integer()) return p->as_number().to_int64();
  return static_cast<int64_t>(p->as_double());
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

std::optional<Json> ParseJson(const std::string& text, std::string* error) {
  std::error_code ec;
  Json v = Json::parse(text, ec);
  if (ec) {
    if (error) *error = ec.message();
    return std::nullopt;
  }
  return v;
}

}  // namespace trellis::op
