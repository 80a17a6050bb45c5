#include "datapath/address.h"

#include <sys/random.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "common/base/net.h"

namespace trellis {
namespace {

constexpr char kTcpTag[] = ";tcp=";
constexpr char kLocalTag[] = ";local=";
constexpr char kLocalNamePrefix[] = "trellis-";
constexpr size_t kLocalNameHexDigits = 32;

// Text from outside as messages show it: cut (a hostile one may be any length), and bytes that
// are not printable ASCII as '?' (no control characters into logs).
std::string Shown(const std::string& text) {
  constexpr size_t kMax = 120;
  std::string out = text.substr(0, kMax);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  if (text.size() > kMax) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace

StatusOr<DataAddress> DataAddress::Parse(const std::string& text) {
  DataAddress a;
  std::string base = text;
  if (auto local = base.find(kLocalTag); local != std::string::npos) {
    std::string name = base.substr(local + std::strlen(kLocalTag));
    base.resize(local);
    if (Status st = CheckLocalName(name); !st.ok()) {
      return InvalidArgumentError("bad data address '" + Shown(text) + "': " + st.message());
    }
    if (base.find(kTcpTag) == std::string::npos) {
      return InvalidArgumentError("bad data address '" + Shown(text) +
                                  "': a local socket without a tcp port");
    }
    a.local_name = std::move(name);
  }
  if (auto tag = base.find(kTcpTag); tag != std::string::npos) {
    std::string p = base.substr(tag + std::strlen(kTcpTag));
    base.resize(tag);
    int port = 0;
    auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (p.empty() || ec != std::errc() || end != p.data() + p.size() || port < 1 || port > 65535) {
      return InvalidArgumentError("bad data address '" + Shown(text) + "': tcp port '" +
                                  Shown(p) + "' is not in [1, 65535]");
    }
    a.tcp_port = port;
  }
  TRELLIS_RETURN_IF_ERROR(ParseHostPort(base).status());
  a.service = std::move(base);
  return a;
}

std::string DataAddress::ToString() const {
  if (tcp_port <= 0) return service;
  std::string a = service + kTcpTag + std::to_string(tcp_port);
  if (!local_name.empty()) a += kLocalTag + local_name;
  return a;
}

Status CheckLocalName(const std::string& name) {
  const size_t prefix = std::strlen(kLocalNamePrefix);
  bool ok = name.size() == prefix + kLocalNameHexDigits &&
            name.compare(0, prefix, kLocalNamePrefix) == 0;
  for (size_t i = prefix; ok && i < name.size(); ++i) {
    ok = (name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f');
  }
  if (!ok) {
    return InvalidArgumentError("local socket name '" + Shown(name) + "' is not " +
                                kLocalNamePrefix + " and " +
                                std::to_string(kLocalNameHexDigits) + " lowercase hex digits");
  }
  return Status::Ok();
}

StatusOr<std::string> NewLocalName() {
  uint8_t bytes[kLocalNameHexDigits / 2];
  size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return UnavailableError(std::string("getrandom: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char kHex[] = "0123456789abcdef";
  std::string name = kLocalNamePrefix;
  for (uint8_t b : bytes) {
    name += kHex[b >> 4];
    name += kHex[b & 15];
  }
  return name;
}

}  // namespace trellis
