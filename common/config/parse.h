// The one set of parsers for configuration values (flags and environment variables): integers
// in a range, durations, booleans. `what` names the source in the error, e.g. "flag --port" or
// "environment variable TRELLIS_RANK"; every error is INVALID_ARGUMENT and quotes the value:
//   "flag --port: not an integer, got 'http'"
//   "environment variable TRELLIS_NUM_WORKERS: must be in 1..100000, got 0"
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace trellis {

// "flag --port" or "environment variable TRELLIS_RANK": how errors name where a value came from.
std::string FlagSource(std::string_view flag);
std::string EnvSourceName(std::string_view env);

// A whole decimal integer (an optional sign, digits, nothing else) in [min, max].
StatusOr<int64_t> ParseInt(const std::string& what, const std::string& text, int64_t min, int64_t max);
// "on" -> true, "off" -> false.
StatusOr<bool> ParseOnOff(const std::string& what, const std::string& text);
// "true" -> true, "false" -> false.
StatusOr<bool> ParseBool(const std::string& what, const std::string& text);
// Decimal seconds in (0, max_seconds] ("0.5", "30"), to the millisecond.
StatusOr<std::chrono::milliseconds> ParseSeconds(const std::string& what, const std::string& text,
                                                 double max_seconds);

}  // namespace trellis
