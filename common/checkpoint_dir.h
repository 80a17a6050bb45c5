// A directory of checkpoints of one writer: "<dir>/<prefix>-<step, 12 digits>.ckpt". Saving
// writes a temporary file, fsyncs it, renames it into place and fsyncs the directory, so a crash
// leaves either the old set or the old set plus the complete new file; then only the newest
// `keep` are kept. Loading takes the newest file that decodes and skips (and reports) bad ones,
// so a corrupt or truncated newest checkpoint falls back to the previous good one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/checkpoint_format.h"
#include "common/status.h"

namespace trellis {

struct LoadedCheckpoint {
  std::string file;
  Checkpoint checkpoint;
  std::vector<Status> skipped;  // newer files that were rejected, each naming file and problem
};

class CheckpointDir {
 public:
  // REQUIRES: keep >= 1; prefix without '/'.
  CheckpointDir(std::string dir, std::string prefix, int32_t keep);

  const std::string& dir() const { return dir_; }
  std::string FileFor(int64_t step) const;

  // Saves `c` as the file for c.step (replacing one of the same step) and prunes old ones.
  // Returns the file name and, in *bytes, its size.
  StatusOr<std::string> Save(const Checkpoint& c, uint64_t* bytes = nullptr);

  // Steps with a file here, newest first (temporary files and other names are ignored).
  StatusOr<std::vector<int64_t>> Steps() const;

  // The checkpoint of exactly `step`; errors name the file and what is wrong with it.
  StatusOr<Checkpoint> Load(int64_t step) const;

  // The newest checkpoint that decodes. NOT_FOUND when there is none (no files, or all bad: the
  // message then lists every rejected file).
  StatusOr<LoadedCheckpoint> LoadNewest() const;

 private:
  Status Prune() const;

  const std::string dir_;
  const std::string prefix_;
  const int32_t keep_;
};

}  // namespace trellis
