// The job token travels with every RPC in this metadata key (DESIGN.md: Security).
#pragma once

#include <string>

#include "common/base/status.h"

namespace trellis {

inline constexpr char kTokenMetadataKey[] = "x-trellis-token";

// Reads the token from a file (TRELLIS_TOKEN_FILE); surrounding whitespace is dropped.
// An empty path yields an empty token (auth off, for local runs that choose so).
StatusOr<std::string> ReadTokenFile(const std::string& path);

// Constant-time comparison so a wrong token leaks no prefix timing.
bool TokenEquals(const std::string& expected, const std::string& got);

}  // namespace trellis
