// Small helpers shared by the SchedulerState translation units (not part of the interface).
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "scheduler/clock.h"
#include "scheduler/shard_map.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::state_internal {

inline const char* RoleName(v1::Role role) { return role == v1::ROLE_SERVER ? "server" : "worker"; }

inline bool KnownRole(v1::Role role) { return role == v1::ROLE_SERVER || role == v1::ROLE_WORKER; }

using KeyPtrs = std::vector<const v1::KeySpec*>;

inline bool SameKey(const v1::KeySpec& a, const v1::KeySpec& b) {
  return a.id() == b.id() && a.name() == b.name() && a.num_elements() == b.num_elements() &&
         a.dtype() == b.dtype();
}

inline bool SameKeys(const KeyPtrs& a, const KeyPtrs& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameKey(*a[i], *b[i])) return false;
  }
  return true;
}

// key 3 "fc2.weight" (the name only when there is one)
inline std::string KeyLabel(const v1::KeySpec& k) {
  std::string s = "key " + std::to_string(k.id());
  if (!k.name().empty()) s += " \"" + k.name() + "\"";
  return s;
}

// (1024 x float32)
inline std::string Shape(const v1::KeySpec& k) {
  return "(" + std::to_string(k.num_elements()) + " x " + DTypeName(k.dtype()) + ")";
}

inline double Seconds(Clock::TimePoint::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace trellis::state_internal
