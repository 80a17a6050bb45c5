#include "common/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include "common/base/mutex.h"
#include "common/config/env_names.h"
namespace trellis {
namespace {

Mutex g_tag_mu;
std::string g_tag GUARDED_BY(g_tag_mu) = "trellis";
std::atomic<int> g_level{[] {
  const char* v = std::getenv(kEnvLogLevel);
  if (v == nullptr) return 1;
  std::string_view s(v);
  if (s == "debug") return 0;
  if (s == "warning" || s == "warn") return 2;
  if (s == "error") return 3;
  return 1;
}()};

}  // namespace

void SetLogTag(std::string tag) {
  MutexLock lock(&g_tag_mu);
  g_tag = std::move(tag);
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

LogLine::~LogLine() {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string tag;
  {
    MutexLock lock(&g_tag_mu);
    tag = g_tag;
  }
  char head[64];
  std::snprintf(head, sizeof(head), "%c %02d:%02d:%02d.%03d ", kLetters[static_cast<int>(level_)],
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  std::string line = head + tag + "] " + stream_.str() + "\n";
  // One write(2) per line keeps lines whole across threads and processes sharing stderr.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace trellis
