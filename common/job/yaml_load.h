// Loading YAML text without exceptions and without yaml-cpp 0.7's runaway LoadAll.
#pragma once

#include <cstdint>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "common/base/status.h"

namespace trellis::yaml {

// The first document of `text` (an undefined node when the text holds none, e.g. only
// comments). *documents is set to the number of documents, counting no further than 2.
// Malformed YAML: InvalidArgument "line <L>, column <C>: malformed YAML: <reason>" (1-based).
//
// Why not YAML::LoadAll: in yaml-cpp 0.7 it loops forever, allocating until the OOM killer
// steps in, on a document that starts with ',' (jbeder/yaml-cpp#1040, fixed upstream by
// #1318/#1319). Documents are counted here with a bounded loop over the event parser instead.
//
// A document that, with its aliases expanded, holds more than kMaxExpandedNodes nodes or
// kMaxExpandedBytes of scalar text is refused (InvalidArgument): every reader of the tree (the
// pod template's emitter, the operator's JSON conversion) expands aliases, so a few hundred
// bytes of nested aliases ("billion laughs") would otherwise cost gigabytes and minutes.
inline constexpr uint64_t kMaxExpandedNodes = 100'000;
inline constexpr uint64_t kMaxExpandedBytes = 4u << 20;
StatusOr<YAML::Node> LoadFirstDocument(std::string_view text, int* documents);

}  // namespace trellis::yaml
