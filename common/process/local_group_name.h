// Names shared by the worker library's shared-memory local groups and the agent that starts a
// multi-GPU pod's processes (and removes what a group that died early left behind).
#pragma once

#include <array>
#include <string>

namespace trellis {

// The channels a LocalGroupWorker opens ("-id": the NCCL id bootstrap of each channel).
inline constexpr std::array<const char*, 4> kLocalGroupChannels = {"rs", "ag", "rs-id", "ag-id"};

// POSIX shm name "/trellis-lg-<name>-<channel>", characters outside [A-Za-z0-9._-] as '_'.
std::string LocalGroupShmName(const std::string& name, const std::string& channel);

// Removes the segments of every channel of group `name` (absent ones are fine).
void UnlinkLocalGroupSegments(const std::string& name);

}  // namespace trellis
