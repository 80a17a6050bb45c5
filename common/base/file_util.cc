#include "common/base/file_util.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace trellis {

Status WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return UnavailableError(tmp + ": cannot create");
    out << text;
    out.flush();
    if (!out) return UnavailableError(tmp + ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return UnavailableError("cannot rename " + tmp + " to " + path);
  }
  return Status::Ok();
}

StatusOr<std::string> ReadFileLimited(const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError(path + ": cannot open");
  std::string out;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    out.append(buf, static_cast<size_t>(in.gcount()));
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      return InvalidArgumentError(path + ": larger than " + std::to_string(max_bytes) + " bytes");
    }
  }
  if (in.bad()) return UnavailableError(path + ": read failed");
  return out;
}

}  // namespace trellis
