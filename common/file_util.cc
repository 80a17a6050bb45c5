#include "common/file_util.h"

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

}  // namespace trellis
