#include "common/base/random_token.h"

#include <fstream>

namespace trellis {

StatusOr<std::string> RandomToken() {
  unsigned char bytes[kRandomTokenBytes];
  std::ifstream in("/dev/urandom", std::ios::binary);
  if (!in.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return InternalError("cannot read /dev/urandom");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string t;
  t.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    t.push_back(kHex[b >> 4]);
    t.push_back(kHex[b & 15]);
  }
  return t;
}

}  // namespace trellis
