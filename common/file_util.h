// Small file helpers shared by the programs.
#pragma once

#include <string>

#include "common/status.h"

namespace trellis {

// Writes `text` to `path` atomically (temporary file + rename) so a reader never sees half.
Status WriteFileAtomic(const std::string& path, const std::string& text);

}  // namespace trellis
