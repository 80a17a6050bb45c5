// Edit distance for "did you mean ...?" suggestions on misspelled field names and enum values.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trellis {

// Optimal-string-alignment distance: insertions, deletions, substitutions and transpositions of
// two adjacent characters each cost 1 ("replcias" is 1 away from "replicas").
int EditDistance(std::string_view a, std::string_view b);

// The candidate `given` most likely meant: a case-insensitive match first, else the closest one
// within `max_distance` (ties: the earlier candidate). nullopt when nothing is close.
std::optional<std::string> SuggestName(std::string_view given,
                                       const std::vector<std::string_view>& candidates,
                                       int max_distance = 2);

}  // namespace trellis
