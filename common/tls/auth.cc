#include "common/tls/auth.h"

#include <fstream>
#include <sstream>

namespace trellis {

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("token file " + path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  auto first = t.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return InvalidArgumentError("token file " + path + ": empty");
  auto last = t.find_last_not_of(" \t\r\n");
  return t.substr(first, last - first + 1);
}

bool TokenEquals(const std::string& expected, const std::string& got) {
  unsigned char diff = expected.size() == got.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    diff |= static_cast<unsigned char>(expected[i]) ^ g;
  }
  return diff == 0;
}

}  // namespace trellis
