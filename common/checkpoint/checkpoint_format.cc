#include "common/checkpoint/checkpoint_format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/checkpoint/crc32c.h"

namespace trellis {
namespace {

// Fixed part of the header before the origin text.
constexpr size_t kHeaderFixed = 8 + 4 + 4 + 8 + 4 + 4;
// Fixed part of one key-table row before its name.
constexpr size_t kRowFixed = 8 + 4 + 4 + 8 + 8 + 8 + 4;
// Guards against absurd counts before anything is allocated.
constexpr uint64_t kMaxNameBytes = 1 << 16;

template <typename T>
void Put(std::string* out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  out->append(b, sizeof(T));
}

// A bounds-checked little-endian reader over the file's bytes.
class Reader {
 public:
  Reader(std::string_view b, size_t pos) : b_(b), pos_(pos) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, std::string* s) {
    if (b_.size() - pos_ < n) return false;
    s->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_;
};

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

std::string EntryName(const CheckpointEntry& e, uint32_t i) {
  std::string s = "entry " + std::to_string(i) + " (key " + std::to_string(e.key);
  if (!e.name.empty()) s += " " + e.name;
  return s + " slice " + std::to_string(e.slice) + ")";
}

}  // namespace

std::string EncodeCheckpoint(const Checkpoint& c) {
  std::string out;
  const uint32_t header_bytes = static_cast<uint32_t>(kHeaderFixed + c.origin.size() + 4);
  out.append(kCheckpointMagic, 8);
  Put<uint32_t>(&out, kCheckpointVersion);
  Put<uint32_t>(&out, header_bytes);
  Put<int64_t>(&out, c.step);
  Put<uint32_t>(&out, static_cast<uint32_t>(c.entries.size()));
  Put<uint32_t>(&out, static_cast<uint32_t>(c.origin.size()));
  out += c.origin;
  Put<uint32_t>(&out, Crc32c(out));

  size_t table_bytes = 4;
  for (const auto& e : c.entries) table_bytes += kRowFixed + e.name.size();
  uint64_t offset = out.size() + table_bytes;
  const size_t table_start = out.size();
  for (const auto& e : c.entries) {
    Put<uint64_t>(&out, e.key);
    Put<uint32_t>(&out, e.slice);
    Put<uint32_t>(&out, static_cast<uint32_t>(e.kind));
    Put<int64_t>(&out, e.step);
    Put<int64_t>(&out, static_cast<int64_t>(e.values.size()));
    Put<uint64_t>(&out, offset);
    Put<uint32_t>(&out, static_cast<uint32_t>(e.name.size()));
    out += e.name;
    offset += e.values.size() * sizeof(float) + 4;
  }
  Put<uint32_t>(&out, Crc32c(out.data() + table_start, out.size() - table_start));

  out.reserve(offset);
  for (const auto& e : c.entries) {
    const size_t n = e.values.size() * sizeof(float);
    out.append(reinterpret_cast<const char*>(e.values.data()), n);
    Put<uint32_t>(&out, Crc32c(e.values.data(), n));
  }
  return out;
}

StatusOr<Checkpoint> DecodeCheckpoint(std::string_view b, const std::string& file) {
  auto loss = [&](const std::string& what) { return DataLossError(file + ": " + what); };
  if (b.size() < 8 || std::memcmp(b.data(), kCheckpointMagic, 8) != 0) {
    return loss(b.size() < 8 ? "truncated: " + std::to_string(b.size()) +
                                   " bytes, shorter than the header"
                             : "not a Trellis checkpoint (bad magic)");
  }
  Reader r(b, 8);
  uint32_t version = 0;
  uint32_t header_bytes = 0;
  Checkpoint c;
  uint32_t entries = 0;
  uint32_t origin_bytes = 0;
  if (!r.Get(&version)) return loss("truncated in the header");
  if (version != kCheckpointVersion) {
    return FailedPreconditionError(file + ": checkpoint format version " +
                                   std::to_string(version) + ", this build reads version " +
                                   std::to_string(kCheckpointVersion));
  }
  if (!r.Get(&header_bytes) || !r.Get(&c.step) || !r.Get(&entries) || !r.Get(&origin_bytes)) {
    return loss("truncated in the header");
  }
  if (header_bytes != kHeaderFixed + uint64_t{origin_bytes} + 4) {
    return loss("corrupt header: header size " + std::to_string(header_bytes) +
                " does not match its origin length " + std::to_string(origin_bytes));
  }
  if (header_bytes > b.size()) {
    return loss("truncated: " + std::to_string(b.size()) + " bytes, the header needs " +
                std::to_string(header_bytes));
  }
  r.Bytes(origin_bytes, &c.origin);
  uint32_t crc = 0;
  r.Get(&crc);
  if (uint32_t want = Crc32c(b.data(), header_bytes - 4); crc != want) {
    return loss("header checksum mismatch (stored " + Hex(crc) + ", computed " + Hex(want) + ")");
  }

  const size_t table_start = r.pos();
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> counts;
  c.entries.reserve(std::min<uint64_t>(entries, b.size() / kRowFixed));
  for (uint32_t i = 0; i < entries; ++i) {
    CheckpointEntry e;
    uint32_t kind = 0;
    int64_t elements = 0;
    uint64_t offset = 0;
    uint32_t name_bytes = 0;
    if (!r.Get(&e.key) || !r.Get(&e.slice) || !r.Get(&kind) || !r.Get(&e.step) ||
        !r.Get(&elements) || !r.Get(&offset) || !r.Get(&name_bytes) || name_bytes > kMaxNameBytes ||
        !r.Bytes(name_bytes, &e.name)) {
      return loss("truncated or corrupt key table at entry " + std::to_string(i) + " of " +
                  std::to_string(entries) + " (file has " + std::to_string(b.size()) + " bytes)");
    }
    if (kind > static_cast<uint32_t>(EntryKind::kOptimizerV) || elements < 0) {
      return loss("corrupt key table: " + EntryName(e, i) + " has kind " + std::to_string(kind) +
                  " and " + std::to_string(elements) + " elements");
    }
    e.kind = static_cast<EntryKind>(kind);
    // Element counts are checked against the file size below, before anything is allocated.
    offsets.push_back(offset);
    counts.push_back(static_cast<uint64_t>(elements));
    c.entries.push_back(std::move(e));
  }
  if (!r.Get(&crc)) return loss("truncated after the key table");
  if (uint32_t want = Crc32c(b.data() + table_start, r.pos() - 4 - table_start); crc != want) {
    return loss("key table checksum mismatch (stored " + Hex(crc) + ", computed " + Hex(want) +
                ")");
  }

  uint64_t pos = r.pos();
  for (uint32_t i = 0; i < entries; ++i) {
    CheckpointEntry& e = c.entries[i];
    const uint64_t offset = offsets[i];
    const uint64_t elements = counts[i];
    if (offset != pos) {
      return loss("corrupt key table: " + EntryName(e, i) + " data at offset " +
                  std::to_string(offset) + ", expected " + std::to_string(pos));
    }
    if (elements > (b.size() - pos) / sizeof(float) ||
        b.size() - pos - elements * sizeof(float) < 4) {
      return loss("truncated: " + EntryName(e, i) + " needs " +
                  std::to_string(elements * sizeof(float) + 4) + " bytes at offset " +
                  std::to_string(pos) + ", the file has " + std::to_string(b.size()));
    }
    const size_t n = elements * sizeof(float);
    uint32_t stored = 0;
    std::memcpy(&stored, b.data() + pos + n, 4);
    if (uint32_t want = Crc32c(b.data() + pos, n); stored != want) {
      return loss("data checksum mismatch in " + EntryName(e, i) + " (stored " + Hex(stored) +
                  ", computed " + Hex(want) + ")");
    }
    e.values.resize(elements);
    std::memcpy(e.values.data(), b.data() + pos, n);
    pos += n + 4;
  }
  if (pos != b.size()) {
    return loss(std::to_string(b.size() - pos) + " unexpected bytes after the last entry");
  }
  return c;
}

}  // namespace trellis
