// One declared key once a shard map placed it: its slices on the servers, its step (the pushes
// this worker made of it, which its servers count too) and how its pushes are encoded.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "datapath/codec/half.h"
#include "datapath/codec/twobit_codec.h"
#include "trellis/trellis.h"

namespace trellis {

struct SliceInfo {
  uint32_t index;
  int64_t offset;
  int64_t num_elements;
  int32_t server;
};

struct KeyState {
  KeyDecl decl;
  std::vector<SliceInfo> slices;
  std::atomic<int64_t> push_step{0};  // steps this worker pushed
  // Residuals per slice (by slice index) when the key's pushes are compressed, else null.
  std::unique_ptr<TwoBitCodec> codec;
  // Set when the key's pushes go as 16-bit frames (the key's wire type or the job's fp16/bf16).
  std::optional<HalfType> half;
};

// How errors name a key: "key 3 (fc1.weight)", or "key 3" when it has no name.
inline std::string KeyName(const KeyDecl& d) {
  std::string s = "key " + std::to_string(d.id);
  if (!d.name.empty()) s += " (" + d.name + ")";
  return s;
}

}  // namespace trellis
