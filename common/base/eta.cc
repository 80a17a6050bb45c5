#include "common/base/eta.h"

#include <cmath>
#include <cstdint>
#include <cstdio>

namespace trellis {

std::string FormatEta(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds) || seconds > 1e12) return "";
  const long long s = static_cast<long long>(std::llround(seconds));
  char buf[64];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else if (s < 86400) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
  }
  return buf;
}

}  // namespace trellis
