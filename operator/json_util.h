// Small, non-throwing accessors over cpprestsdk JSON: objects come from the API server (a peer),
// so a missing or wrongly typed field is a value (empty / nullopt), never an exception.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include <cpprest/json.h>

namespace trellis::op {

using Json = web::json::value;
using Clock = std::chrono::system_clock;

// The value at a path of object keys, or nullptr.
const Json* At(const Json& v, std::initializer_list<const char*> path);
// The string at path; `def` when absent or not a string.
std::string Str(const Json& v, std::initializer_list<const char*> path, const std::string& def = "");
std::optional<int64_t> Int(const Json& v, std::initializer_list<const char*> path);
bool Bool(const Json& v, std::initializer_list<const char*> path, bool def = false);

// Sets v[k1][k2]... = value, creating objects on the way (replacing non-objects).
void Put(Json& v, std::initializer_list<const char*> path, Json value);

Json JStr(const std::string& s);
Json JStrings(const std::initializer_list<std::string>& items);

// RFC 3339 in UTC with second precision ("2026-11-23T01:03:07Z"), as Kubernetes writes times.
std::string FormatTime(Clock::time_point t);
std::optional<Clock::time_point> ParseTime(const std::string& s);

// Parses JSON text; an error (not an exception) for bad input.
std::optional<Json> ParseJson(const std::string& text, std::string* error = nullptr);

}  // namespace trellis::op
