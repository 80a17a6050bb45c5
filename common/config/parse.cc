#include "common/config/parse.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace trellis {
namespace {

std::string Quoted(const std::string& text) { return "'" + text.substr(0, 64) + "'"; }

}  // namespace

std::string FlagSource(std::string_view flag) { return "flag --" + std::string(flag); }
std::string EnvSourceName(std::string_view env) { return "environment variable " + std::string(env); }

StatusOr<int64_t> ParseInt(const std::string& what, const std::string& text, int64_t min, int64_t max) {
  // A leading '+' is accepted (strtoll did, where flags were parsed with it); spaces are not.
  const size_t skip = text.size() > 1 && text[0] == '+' && text[1] != '-' ? 1 : 0;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data() + skip, text.data() + text.size(), v);
  if (text.empty() || ec == std::errc::invalid_argument || ptr != text.data() + text.size()) {
    return InvalidArgumentError(what + ": not an integer, got " + Quoted(text));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return InvalidArgumentError(what + ": must be in " + std::to_string(min) + ".." + std::to_string(max) +
                                ", got " + text.substr(0, 64));
  }
  return v;
}

StatusOr<bool> ParseOnOff(const std::string& what, const std::string& text) {
  if (text == "on") return true;
  if (text == "off") return false;
  return InvalidArgumentError(what + ": must be on or off, got " + Quoted(text));
}

StatusOr<bool> ParseBool(const std::string& what, const std::string& text) {
  if (text == "true") return true;
  if (text == "false") return false;
  return InvalidArgumentError(what + ": must be true or false, got " + Quoted(text));
}

StatusOr<std::chrono::milliseconds> ParseSeconds(const std::string& what, const std::string& text,
                                                 double max_seconds) {
  char* end = nullptr;
  const double secs = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(secs) || !(secs > 0) || secs > max_seconds) {
    char max[32];
    std::snprintf(max, sizeof max, "%g", max_seconds);
    return InvalidArgumentError(what + ": must be seconds in (0, " + max + "], got " + Quoted(text));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(secs * 1000.0));
}

}  // namespace trellis
