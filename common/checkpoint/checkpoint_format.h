// The checkpoint file format (docs/checkpoints.md), shared by the worker library (rank 0's model)
// and the parameter server (its shards with optimizer state). All integers little-endian.
//
//   header    magic "TRLSCKPT" | u32 version (1) | u32 header bytes | i64 step | u32 entries |
//             u32 origin bytes | origin text | u32 crc32c of everything before in the header
//   key table per entry: u64 key | u32 slice | u32 kind | i64 step | i64 elements |
//             u64 data offset | u32 name bytes | name; then u32 crc32c of the table
//   data      per entry, in table order: elements x f32, then u32 crc32c of those bytes
//
// The file ends exactly after the last data section. Decoding checks every bound before reading
// and every checksum, and names the file and the section that is wrong; it never trusts a length
// it has not checked against the file size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/status.h"

namespace trellis {

inline constexpr char kCheckpointMagic[8] = {'T', 'R', 'L', 'S', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kCheckpointVersion = 1;

// What an entry's values are.
enum class EntryKind : uint32_t {
  kValues = 0,        // parameters (or any named tensor a program saves)
  kOptimizerM = 1,    // server optimizer state: momentum buffer / Adam first moment
  kOptimizerV = 2,    // Adam second moment
};

struct CheckpointEntry {
  uint64_t key = 0;
  uint32_t slice = 0;
  EntryKind kind = EntryKind::kValues;
  int64_t step = 0;  // the entry's own step (a server slice's complete step)
  std::string name;
  std::vector<float> values;

  bool operator==(const CheckpointEntry&) const = default;
};

struct Checkpoint {
  int64_t step = 0;
  std::string origin;  // who wrote it, e.g. "worker rank 0" or "server 1 (update mode)"
  std::vector<CheckpointEntry> entries;

  bool operator==(const Checkpoint&) const = default;
};

std::string EncodeCheckpoint(const Checkpoint& c);

// `file` names the source in every error ("<file>: <what is wrong>"). DATA_LOSS for corrupt or
// truncated bytes, FAILED_PRECONDITION for a version this build does not read.
StatusOr<Checkpoint> DecodeCheckpoint(std::string_view bytes, const std::string& file);

}  // namespace trellis
