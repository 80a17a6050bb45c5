// A directory of checkpoints of one writer: "<dir>/<prefix>-<step, 12 digits>.ckpt". Saving
// writes a temporary file, fsyncs it, renames it into place and fsyncs the directory, so a crash
// leaves either the old set or the old set plus the complete new file; then only the newest
// `keep` valid ones are kept. A file that does not load (corrupt, truncated, unreadable) never
// counts towards `keep` and is never deleted or overwritten: it is renamed aside to
// "<name>.corrupt" for a person to look at, so a stray bad file can neither push out the good
// checkpoints nor stand in for the newest one. Loading takes the newest file that decodes and
// skips (and reports) bad ones, so a corrupt newest checkpoint falls back to the previous good one.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "common/base/mutex.h"
#include "common/checkpoint/checkpoint_format.h"
#include "common/base/status.h"

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

  // Saves `c` as the file for c.step (replacing a valid one of the same step; an invalid one is
  // moved aside first) and prunes old valid ones; invalid files found on the way are moved aside.
  // Returns the file name and, in *bytes, its size.
  StatusOr<std::string> Save(const Checkpoint& c, uint64_t* bytes = nullptr);

  // Steps with a file here, newest first (temporary files and other names are ignored).
  StatusOr<std::vector<int64_t>> Steps() const;

  // The checkpoint of exactly `step`; errors name the file and what is wrong with it.
  StatusOr<Checkpoint> Load(int64_t step) const;

  // Where a file that does not load is moved: "<file>.corrupt" (".corrupt.<n>" if taken).
  static std::string AsideName(const std::string& file);

  // The newest checkpoint that decodes. NOT_FOUND when there is none (no files, or all bad: the
  // message then lists every rejected file).
  StatusOr<LoadedCheckpoint> LoadNewest() const;

 private:
  Status Prune() const;
  // Whether the file of `step` loads (decoded once per process; files saved here are known good).
  // A file that does not is moved aside (and *moved says so).
  bool CheckValid(int64_t step, Status* why) const;
  Status MoveAside(const std::string& file, const Status& why) const;

  const std::string dir_;
  const std::string prefix_;
  const int32_t keep_;
  mutable Mutex mu_;
  // Steps whose file loaded or was saved here.
  mutable std::set<int64_t> known_valid_ GUARDED_BY(mu_);
};

}  // namespace trellis
