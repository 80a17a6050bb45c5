// Minimal line logger: "I 12:00:00.123 scheduler] message" to stderr, one write per line so
// lines from concurrent threads and processes do not interleave.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

namespace trellis {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Process-wide settings, set once from main() (the program's short name, e.g. "scheduler").
void SetLogTag(std::string tag);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace trellis

#define TLOG_DEBUG if (::trellis::LogEnabled(::trellis::LogLevel::kDebug)) ::trellis::LogLine(::trellis::LogLevel::kDebug)
#define TLOG_INFO if (::trellis::LogEnabled(::trellis::LogLevel::kInfo)) ::trellis::LogLine(::trellis::LogLevel::kInfo)
#define TLOG_WARN if (::trellis::LogEnabled(::trellis::LogLevel::kWarning)) ::trellis::LogLine(::trellis::LogLevel::kWarning)
#define TLOG_ERROR ::trellis::LogLine(::trellis::LogLevel::kError)
