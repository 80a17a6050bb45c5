#include "common/termination_report.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sstream>

namespace trellis {
namespace {

constexpr char kError[] = "error";
constexpr char kCommandNotFound[] = "command-not-found";
constexpr char kExit[] = "exit";
constexpr char kRestarts[] = "restarts";
constexpr char kJobFailed[] = "job-failed";

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

}  // namespace

std::string FormatTerminationReport(const TerminationReport& r) {
  std::string out;
  auto line = [&](const char* key, const std::string& value) {
    if (value.empty()) return;
    out += std::string(key) + ": " + OneLine(value) + "\n";
  };
  line(kError, r.error);
  line(kCommandNotFound, r.command_not_found);
  line(kExit, r.exit);
  if (r.restarts > 0) line(kRestarts, std::to_string(r.restarts));
  line(kJobFailed, r.job_failed);  // last: the longest, the one cut when too long
  if (out.size() > kMaxTerminationMessage) out = out.substr(0, kMaxTerminationMessage - 4) + "...\n";
  return out;
}

TerminationReport ParseTerminationReport(const std::string& text) {
  TerminationReport r;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    const size_t colon = l.find(": ");
    if (colon == std::string::npos) continue;
    const std::string key = l.substr(0, colon), value = l.substr(colon + 2);
    if (key == kError) {
      r.error = value;
    } else if (key == kCommandNotFound) {
      r.command_not_found = value;
    } else if (key == kExit) {
      r.exit = value;
    } else if (key == kRestarts) {
      if (!value.empty() && value.size() < 9 && std::all_of(value.begin(), value.end(), ::isdigit)) {
        r.restarts = std::stoi(value);
      }
    } else if (key == kJobFailed) {
      r.job_failed = value;
    }
  }
  return r;
}

Status WriteTerminationMessage(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);  // never O_CREAT
  if (fd < 0) {
    if (errno == ENOENT) return Status::Ok();
    return InternalError("termination message " + path + ": " + strerror(errno));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      return InternalError("termination message " + path + ": " + strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

}  // namespace trellis
