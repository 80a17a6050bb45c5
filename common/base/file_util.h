// Small file helpers shared by the programs.
#pragma once

#include <cstdint>
#include <string>

#include "common/base/status.h"

namespace trellis {

// Writes `text` to `path` atomically (temporary file + rename) so a reader never sees half.
Status WriteFileAtomic(const std::string& path, const std::string& text);

// The whole file, refused when larger than `max_bytes` (NOT_FOUND when it cannot be opened).
StatusOr<std::string> ReadFileLimited(const std::string& path, int64_t max_bytes);

}  // namespace trellis
