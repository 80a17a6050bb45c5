#include "common/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/base/logging.h"

namespace trellis {
namespace {

constexpr char kSuffix[] = ".ckpt";
constexpr int kStepDigits = 12;

Status Errno(const std::string& what, const std::string& file) {
  return InternalError(what + " " + file + ": " + std::strerror(errno));
}

Status WriteAll(int fd, const std::string& data, const std::string& file) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("writing", file);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FsyncPath(const std::string& path, int flags, const std::string& what) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno("opening " + what, path);
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("fsync of " + what, path);
  return Status::Ok();
}

}  // namespace

CheckpointDir::CheckpointDir(std::string dir, std::string prefix, int32_t keep)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), keep_(std::max(keep, 1)) {}

std::string CheckpointDir::FileFor(int64_t step) const {
  char digits[32];
  std::snprintf(digits, sizeof(digits), "%0*lld", kStepDigits, static_cast<long long>(step));
  return dir_ + "/" + prefix_ + "-" + digits + kSuffix;
}

StatusOr<std::string> CheckpointDir::Save(const Checkpoint& c, uint64_t* bytes) {
  if (c.step < 0) return InvalidArgumentError("checkpoint step " + std::to_string(c.step) + " < 0");
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return InternalError("creating checkpoint directory " + dir_ + ": " + ec.message());
  const std::string final_name = FileFor(c.step);
  // Dot-prefixed and suffixed: never listed as a checkpoint, even if a crash leaves it behind.
  const std::string tmp = dir_ + "/." + prefix_ + "-" + std::to_string(c.step) + "." +
                          std::to_string(::getpid()) + ".tmp";
  const std::string data = EncodeCheckpoint(c);
  // A bad file of this very step is evidence: keep it aside rather than rename over it.
  if (struct stat st_buf; ::stat(final_name.c_str(), &st_buf) == 0) {
    Status why;
    (void)CheckValid(c.step, &why);
  }
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating", tmp);
  Status st = WriteAll(fd, data, tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Errno("fsync of", tmp);
  if (::close(fd) != 0 && st.ok()) st = Errno("closing", tmp);
  if (st.ok() && ::rename(tmp.c_str(), final_name.c_str()) != 0) {
    st = Errno("renaming " + tmp + " to", final_name);
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  TRELLIS_RETURN_IF_ERROR(FsyncPath(dir_, O_RDONLY | O_DIRECTORY, "checkpoint directory"));
  {
    MutexLock lock(&mu_);
    known_valid_.insert(c.step);
  }
  if (bytes != nullptr) *bytes = data.size();
  TRELLIS_RETURN_IF_ERROR(Prune());
  return final_name;
}

StatusOr<std::vector<int64_t>> CheckpointDir::Steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return steps;
    return InternalError("listing checkpoint directory " + dir_ + ": " + ec.message());
  }
  const std::string head = prefix_ + "-";
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) return InternalError("listing checkpoint directory " + dir_ + ": " + ec.message());
    const std::string name = it->path().filename().string();
    const size_t want = head.size() + kStepDigits + std::strlen(kSuffix);
    if (name.size() != want || name.rfind(head, 0) != 0 ||
        name.compare(name.size() - std::strlen(kSuffix), std::string::npos, kSuffix) != 0) {
      continue;
    }
    const std::string digits = name.substr(head.size(), kStepDigits);
    if (!std::all_of(digits.begin(), digits.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      continue;
    }
    steps.push_back(std::stoll(digits));
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

std::string CheckpointDir::AsideName(const std::string& file) {
  std::string aside = file + ".corrupt";
  struct stat st;
  for (int n = 1; ::lstat(aside.c_str(), &st) == 0 && n < 1000; ++n) {
    aside = file + ".corrupt." + std::to_string(n);
  }
  return aside;
}

Status CheckpointDir::MoveAside(const std::string& file, const Status& why) const {
  const std::string aside = AsideName(file);
  if (::rename(file.c_str(), aside.c_str()) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Errno("moving the bad checkpoint aside:", file);
  }
  TLOG_WARN << "checkpoint " << file << " does not load (" << why.message()
            << "); moved aside to " << aside << ", not counted towards keep";
  return Status::Ok();
}

bool CheckpointDir::CheckValid(int64_t step, Status* why) const {
  {
    MutexLock lock(&mu_);
    if (known_valid_.count(step) != 0) return true;
  }
  auto c = Load(step);
  if (c.ok()) {
    MutexLock lock(&mu_);
    known_valid_.insert(step);
    return true;
  }
  *why = c.status();
  Status moved = MoveAside(FileFor(step), c.status());
  if (!moved.ok()) *why = moved;
  return false;
}

Status CheckpointDir::Prune() const {
  TRELLIS_ASSIGN_OR_RETURN(std::vector<int64_t> steps, Steps());
  int32_t valid = 0;
  for (int64_t step : steps) {  // newest first
    Status why;
    if (!CheckValid(step, &why)) continue;  // moved aside, never counted
    if (++valid <= keep_) continue;
    const std::string f = FileFor(step);
    if (::unlink(f.c_str()) != 0 && errno != ENOENT) return Errno("removing old checkpoint", f);
    MutexLock lock(&mu_);
    known_valid_.erase(step);
  }
  return Status::Ok();
}

StatusOr<Checkpoint> CheckpointDir::Load(int64_t step) const {
  const std::string f = FileFor(step);
  std::ifstream in(f, std::ios::binary);
  if (!in) return NotFoundError(f + ": cannot open: " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return InternalError(f + ": read error");
  TRELLIS_ASSIGN_OR_RETURN(Checkpoint c, DecodeCheckpoint(buf.str(), f));
  if (c.step != step) {
    return DataLossError(f + ": holds step " + std::to_string(c.step) + ", its name says step " +
                         std::to_string(step));
  }
  return c;
}

StatusOr<LoadedCheckpoint> CheckpointDir::LoadNewest() const {
  TRELLIS_ASSIGN_OR_RETURN(std::vector<int64_t> steps, Steps());
  LoadedCheckpoint out;
  for (int64_t step : steps) {
    auto c = Load(step);
    if (!c.ok()) {
      out.skipped.push_back(c.status());
      continue;
    }
    {
      MutexLock lock(&mu_);
      known_valid_.insert(step);
    }
    out.file = FileFor(step);
    out.checkpoint = std::move(*c);
    return out;
  }
  std::string msg = "no usable checkpoint " + prefix_ + "-*" + kSuffix + " in " + dir_;
  for (const auto& s : out.skipped) msg += "; rejected " + s.message();
  return NotFoundError(msg);
}

}  // namespace trellis
