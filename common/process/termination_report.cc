#include "common/process/termination_report.h"

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
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
constexpr char kProgramError[] = "program-error";
constexpr char kLost[] = "lost";
constexpr char kTakenOver[] = "taken-over";

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

// The length of the valid UTF-8 character at s[i] (1 for ASCII), or 0 when the bytes there are
// not one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
size_t Utf8Length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string CleanProgramError(const std::string& raw) {
  // Only the head can show: a hostile megabyte is not scanned to the end.
  constexpr size_t kScan = 4 * kMaxProgramError;
  const size_t scan = std::min(raw.size(), kScan);
  std::string out;
  out.reserve(std::min(scan, kMaxProgramError + 8));
  for (size_t i = 0; i < scan && out.size() <= kMaxProgramError;) {
    const char c = raw[i];
    if (c == '\n' || c == '\r' || c == '\t') {
      out += ' ';
      ++i;
      continue;
    }
    const size_t n = Utf8Length(raw, i);
    const bool control = n == 1 ? static_cast<unsigned char>(c) < 0x20 || c == 0x7f
                                : n == 2 && static_cast<unsigned char>(c) == 0xC2 &&
                                      static_cast<unsigned char>(raw[i + 1]) <= 0x9F;  // C1
    if (n == 0 || control) {
      out += '?';
      i += std::max<size_t>(n, 1);
      continue;
    }
    out.append(raw, i, n);
    i += n;
  }
  const bool longer = out.size() > kMaxProgramError || raw.size() > scan;
  const size_t first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "";
  out.erase(0, first);
  out.erase(out.find_last_not_of(' ') + 1);
  if (!longer) return out;
  if (out.size() > kMaxProgramError - 3) {
    size_t cut = kMaxProgramError - 3;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;  // a character's head
    out.resize(cut);
  }
  return out + "...";
}

std::string ReadProgramError(const std::string& path) {
  // O_NONBLOCK: a FIFO left there opens without waiting for a writer; O_NOFOLLOW: no link is
  // followed (to /dev/zero, to a file of someone else's).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return "";
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "";
  }
  std::string raw(kMaxProgramError + 1, '\0');  // one more: a longer file is cut, "..."
  size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = ::read(fd, raw.data() + got, raw.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  raw.resize(got);
  return CleanProgramError(raw);
}

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
  line(kProgramError, CleanProgramError(r.program_error));
  line(kLost, r.lost);
  line(kTakenOver, r.taken_over);
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
    } else if (key == kLost) {
      r.lost = value;
    } else if (key == kTakenOver) {
      r.taken_over = value;
    } else if (key == kJobFailed) {
      r.job_failed = value;
    } else if (key == kProgramError) {
      r.program_error = CleanProgramError(value);
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
