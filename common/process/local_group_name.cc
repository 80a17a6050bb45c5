#include "common/process/local_group_name.h"

#include <sys/mman.h>

#include <cctype>

namespace trellis {

std::string LocalGroupShmName(const std::string& name, const std::string& channel) {
  std::string s = "/trellis-lg-" + name + "-" + channel;
  for (size_t i = 1; i < s.size(); ++i) {  // one path component
    const char c = s[i];
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) {
      s[i] = '_';
    }
  }
  return s;
}

void UnlinkLocalGroupSegments(const std::string& name) {
  for (const char* channel : kLocalGroupChannels) {
    shm_unlink(LocalGroupShmName(name, channel).c_str());
  }
}

}  // namespace trellis
