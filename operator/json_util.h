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
// The integer at path; nullopt when absent, not a number, or out of the int64 range (a double
// such as 1e300 or NaN is not cast).
std::optional<int64_t> Int(const Json& v, std::initializer_list<const char*> path);
bool Bool(const Json& v, std::initializer_list<const char*> path, bool def = false);

// Sets v[k1][k2]... = value, creating objects on the way (replacing non-objects).
void Put(Json& v, std::initializer_list<const char*> path, Json value);

Json JStr(const std::string& s);
// `s` cut to at most `max` bytes (on a UTF-8 character boundary), "..." marking the cut.
std::string Truncate(const std::string& s, size_t max);
Json JStrings(const std::initializer_list<std::string>& items);

// RFC 3339 in UTC with second precision ("2026-11-23T01:03:07Z"), as Kubernetes writes times.
std::string FormatTime(Clock::time_point t);
std::optional<Clock::time_point> ParseTime(const std::string& s);

// Parses JSON text; an error (not an exception) for bad input. cpprestsdk refuses documents nested
// deeper than 128 levels, so one object with a deep pod template would make every LIST of
// TrainingJobs unreadable: containers nested deeper than kMaxJsonDepth are replaced by the string
// kTooDeep instead (the reconciler fails the job that holds it, FindTooDeep).
std::optional<Json> ParseJson(const std::string& text, std::string* error = nullptr);

inline constexpr int kMaxJsonDepth = 100;
inline constexpr char kTooDeep[] = "\x01trellis: nested too deep";
// The path ("spec.workers.template.spec...") of the first kTooDeep in v; nullopt when none.
std::optional<std::string> FindTooDeep(const Json& v);
// `text` with every array or object that opens below depth `max_depth` replaced by kTooDeep
// (exposed for tests; the text is scanned lexically, strings and escapes respected).
std::string CapJsonDepth(const std::string& text, int max_depth);

}  // namespace trellis::op
