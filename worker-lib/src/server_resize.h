// A server resize on the worker (docs/elastic.md#servers; the servers' half is
// pserver/slice_handover.h, the decision world_switch.h). At the step boundary where the resize
// takes effect (this worker pushed and pulled every step before it, none after), the worker
// connects to the servers it adds, installs the new shard map on every server of either count,
// places its keys on their new servers (KeyTable::Relayout, which checks the map and names the
// slices whose owner changes), moves each of those -- each part of its state taken from the old
// owner (DataService.HandOver, handout of the key's last step) and given to the new one
// (handin) -- and closes the connections to the servers removed.
//
// Every worker moves every moved slice: a handover repeated by another worker is a no-op on the
// server, so no worker waits for another and none holds up the others. Sequential, one control
// call per part: a model of N moved slices costs 2N-6N calls per worker, once per resize.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "trellis/v1/scheduler.pb.h"
#include "worker-lib/src/key_table.h"
#include "worker-lib/src/server_set.h"

namespace trellis {

// REQUIRES: no operation in flight (a step boundary); `map` has world_epoch of the new world and
// `addresses` a data address per server of it.
Status ResizeServers(KeyTable* keys, ServerSet* servers, const v1::ShardMap& map,
                     const std::vector<std::string>& addresses, int64_t timeout_ms);

}  // namespace trellis
