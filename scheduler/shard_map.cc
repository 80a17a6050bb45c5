#include "scheduler/shard_map.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>
#include <queue>
#include <utility>

namespace trellis {

int64_t DTypeSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    default:
      return 0;
  }
}

std::string DTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_UNSPECIFIED:
      return "unspecified";
    default:
      return "dtype(" + std::to_string(static_cast<int>(dtype)) + ")";
  }
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

namespace {

std::string KeyLabel(const v1::KeySpec& k) {
  std::string s = "key " + std::to_string(k.id());
  if (!k.name().empty()) s += " \"" + k.name() + "\"";
  return s;
}

}  // namespace

namespace {

template <typename Container>
std::vector<const v1::KeySpec*> SortedPointers(const Container& keys) {
  std::vector<const v1::KeySpec*> out;
  out.reserve(static_cast<size_t>(keys.size()));
  for (const auto& k : keys) out.push_back(&k);
  std::sort(out.begin(), out.end(),
            [](const v1::KeySpec* a, const v1::KeySpec* b) { return a->id() < b->id(); });
  return out;
}

}  // namespace

std::vector<const v1::KeySpec*> SortedById(
    const google::protobuf::RepeatedPtrField<v1::KeySpec>& keys) {
  return SortedPointers(keys);
}

std::vector<const v1::KeySpec*> SortedById(const std::vector<v1::KeySpec>& keys) {
  return SortedPointers(keys);
}

Status ValidateSortedKeys(const std::vector<const v1::KeySpec*>& sorted) {
  for (size_t i = 0; i < sorted.size(); ++i) {
    const v1::KeySpec& k = *sorted[i];
    if (i > 0 && sorted[i - 1]->id() == k.id()) {
      return InvalidArgumentError("duplicate key id " + std::to_string(k.id()) + " (" +
                                  KeyLabel(*sorted[i - 1]) + " and " + KeyLabel(k) + ")");
    }
    if (k.num_elements() < 1) {
      return InvalidArgumentError(KeyLabel(k) + ": num_elements must be >= 1, got " +
                                  std::to_string(k.num_elements()));
    }
    if (DTypeSize(k.dtype()) == 0) {
      return InvalidArgumentError(KeyLabel(k) + ": dtype must be set to a known type, got " +
                                  DTypeName(k.dtype()));
    }
  }
  return Status::Ok();
}

Status ValidateKeys(const std::vector<v1::KeySpec>& keys) {
  return ValidateSortedKeys(SortedById(keys));
}

Status ValidateShardSettings(std::string_view dispatch, int32_t num_servers, int64_t slice_bytes) {
  if (dispatch != kDispatchRoundRobin && dispatch != kDispatchHash &&
      dispatch != kDispatchBalanced) {
    return InvalidArgumentError("dispatch must be roundRobin, hash or balanced, got \"" +
                                std::string(dispatch) + "\"");
  }
  if (num_servers < 1) {
    return InvalidArgumentError("number of servers must be >= 1, got " +
                                std::to_string(num_servers));
  }
  // float32 is the only element type today; a new dtype adds its size here.
  if (slice_bytes < 4 || slice_bytes % DTypeSize(v1::DTYPE_FLOAT32) != 0) {
    return InvalidArgumentError("sliceBytes must be >= 4 and a multiple of 4 (the float32 size), got " +
                                std::to_string(slice_bytes));
  }
  return Status::Ok();
}

Status ValidateShardMap(const v1::ShardMap& map, int32_t num_servers, std::string_view dispatch,
                        int64_t slice_bytes) {
  if (map.num_servers() != num_servers || map.dispatch() != dispatch ||
      map.slice_bytes() != slice_bytes) {
    return FailedPreconditionError(
        "the map is for " + std::to_string(map.num_servers()) + " servers, dispatch \"" +
        map.dispatch() + "\", sliceBytes " + std::to_string(map.slice_bytes()) + "; the job has " +
        std::to_string(num_servers) + ", \"" + std::string(dispatch) + "\", " +
        std::to_string(slice_bytes));
  }
  for (int i = 0; i < map.keys_size(); ++i) {
    const v1::KeyShards& ks = map.keys(i);
    const v1::KeySpec& k = ks.key();
    if (i > 0 && map.keys(i - 1).key().id() >= k.id()) {
      return InvalidArgumentError("keys not sorted by id at " + KeyLabel(k));
    }
    TRELLIS_RETURN_IF_ERROR(ValidateSortedKeys({&k}));
    int64_t next = 0;
    for (int j = 0; j < ks.slices_size(); ++j) {
      const v1::SliceAssignment& sa = ks.slices(j);
      if (sa.index() != static_cast<uint32_t>(j) || sa.offset() != next || sa.num_elements() < 1 ||
          sa.server() < 0 || sa.server() >= num_servers) {
        return InvalidArgumentError(KeyLabel(k) + ": slice " + std::to_string(j) +
                                    " is not the next slice on a server of the job");
      }
      next += sa.num_elements();
    }
    if (next != k.num_elements()) {
      return InvalidArgumentError(KeyLabel(k) + ": slices cover " + std::to_string(next) + " of " +
                                  std::to_string(k.num_elements()) + " elements");
    }
  }
  return Status::Ok();
}

std::string ShardMapBytes(const v1::ShardMap& map) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream sos(&out);
    google::protobuf::io::CodedOutputStream cos(&sos);
    cos.SetSerializationDeterministic(true);
    map.SerializeToCodedStream(&cos);
  }
  return out;
}

int64_t SliceElements(const v1::KeySpec& k, int64_t slice_bytes) {
  const int64_t elem = DTypeSize(k.dtype());
  const int64_t bytes = k.num_elements() * elem;
  if (slice_bytes <= kHalvedKeyMaxSliceBytes && bytes >= kHalvedKeyMinBytes &&
      bytes < 2 * slice_bytes) {
    return std::min(slice_bytes / elem, (k.num_elements() + 1) / 2);
  }
  return slice_bytes / elem;
}

StatusOr<v1::ShardMap> BuildShardMap(std::vector<v1::KeySpec> keys, int32_t num_servers,
                                     std::string_view dispatch, int64_t slice_bytes) {
  TRELLIS_RETURN_IF_ERROR(ValidateShardSettings(dispatch, num_servers, slice_bytes));
  TRELLIS_RETURN_IF_ERROR(ValidateKeys(keys));
  std::sort(keys.begin(), keys.end(),
            [](const v1::KeySpec& a, const v1::KeySpec& b) { return a.id() < b.id(); });

  // Count slices first so a hostile declaration is refused before anything is allocated.
  int64_t total_slices = 0;
  for (const auto& k : keys) {
    const int64_t per_slice = SliceElements(k, slice_bytes);
    total_slices += (k.num_elements() + per_slice - 1) / per_slice;
    if (total_slices > kMaxTotalSlices) {
      return ResourceExhaustedError("the declared keys make more than " +
                                    std::to_string(kMaxTotalSlices) +
                                    " slices; raise sliceBytes (now " +
                                    std::to_string(slice_bytes) + ")");
    }
  }

  v1::ShardMap map;
  map.set_slice_bytes(slice_bytes);
  map.set_dispatch(std::string(dispatch));
  map.set_num_servers(num_servers);
  std::vector<int64_t> load(static_cast<size_t>(num_servers), 0);
  map.mutable_keys()->Reserve(static_cast<int>(keys.size()));

  // Cut every key into slices; the server is filled in below.
  for (const auto& k : keys) {
    const int64_t per_slice = SliceElements(k, slice_bytes);
    auto* ks = map.add_keys();
    *ks->mutable_key() = k;
    uint32_t index = 0;
    for (int64_t off = 0; off < k.num_elements(); off += per_slice, ++index) {
      auto* s = ks->add_slices();
      s->set_index(index);
      s->set_offset(off);
      s->set_num_elements(std::min(per_slice, k.num_elements() - off));
    }
  }

  if (dispatch == kDispatchRoundRobin) {
    int64_t j = 0;
    for (auto& ks : *map.mutable_keys()) {
      for (auto& s : *ks.mutable_slices()) {
        s.set_server(static_cast<int32_t>(j % num_servers));
        ++j;
      }
    }
  } else if (dispatch == kDispatchHash) {
    for (auto& ks : *map.mutable_keys()) {
      const auto server = static_cast<int32_t>(SplitMix64(ks.key().id()) %
                                               static_cast<uint64_t>(num_servers));
      for (auto& s : *ks.mutable_slices()) s.set_server(server);
    }
  } else {  // balanced: greedy LPT
    struct Ref {
      int64_t bytes;
      int key;    // index into map.keys (id order)
      int slice;  // index within the key
    };
    std::vector<Ref> refs;
    refs.reserve(static_cast<size_t>(total_slices));
    for (int i = 0; i < map.keys_size(); ++i) {
      const auto& ks = map.keys(i);
      const int64_t elem = DTypeSize(ks.key().dtype());
      for (int j = 0; j < ks.slices_size(); ++j) {
        refs.push_back({ks.slices(j).num_elements() * elem, i, j});
      }
    }
    std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) {
      if (a.bytes != b.bytes) return a.bytes > b.bytes;
      if (a.key != b.key) return a.key < b.key;
      return a.slice < b.slice;
    });
    // Min-heap of (load, rank): the top is the least-loaded server, lowest rank on ties.
    using Entry = std::pair<int64_t, int32_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (int32_t r = 0; r < num_servers; ++r) heap.push({0, r});
    for (const auto& ref : refs) {
      auto [l, r] = heap.top();
      heap.pop();
      map.mutable_keys(ref.key)->mutable_slices(ref.slice)->set_server(r);
      heap.push({l + ref.bytes, r});
    }
  }

  for (const auto& ks : map.keys()) {
    const int64_t elem = DTypeSize(ks.key().dtype());
    for (const auto& s : ks.slices()) load[static_cast<size_t>(s.server())] += s.num_elements() * elem;
  }
  for (int64_t b : load) map.add_server_bytes(b);
  return map;
}

StatusOr<v1::ShardMap> ExtendShardMap(const v1::ShardMap& base, std::vector<v1::KeySpec> added) {
  for (const auto& k : added) {
    for (const auto& ks : base.keys()) {
      if (ks.key().id() == k.id()) {
        return InvalidArgumentError("key " + std::to_string(k.id()) +
                                    " is already in the shard map");
      }
    }
  }
  TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap more, BuildShardMap(std::move(added), base.num_servers(),
                                                            base.dispatch(), base.slice_bytes()));
  v1::ShardMap out = base;
  out.clear_keys();
  // Merge two id-sorted lists.
  int i = 0, j = 0;
  while (i < base.keys_size() || j < more.keys_size()) {
    const bool take_base = j >= more.keys_size() ||
                           (i < base.keys_size() && base.keys(i).key().id() < more.keys(j).key().id());
    *out.add_keys() = take_base ? base.keys(i++) : more.keys(j++);
  }
  for (int s = 0; s < out.server_bytes_size() && s < more.server_bytes_size(); ++s) {
    out.set_server_bytes(s, out.server_bytes(s) + more.server_bytes(s));
  }
  return out;
}

StatusOr<v1::ShardMap> RelayoutShardMap(const v1::ShardMap& base, int32_t num_servers,
                                        int64_t world_epoch) {
  std::vector<v1::KeySpec> keys;
  keys.reserve(static_cast<size_t>(base.keys_size()));
  for (const auto& k : base.keys()) keys.push_back(k.key());
  TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap map,
                           BuildShardMap(std::move(keys), num_servers, base.dispatch(), base.slice_bytes()));
  map.set_world_epoch(world_epoch);
  return map;
}

}  // namespace trellis
