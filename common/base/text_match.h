// Lexical checks of untrusted text (job files, TrainingJob objects) as plain loops: linear time,
// constant stack, whatever the length. std::regex recurses once per character and overflowed
// the stack on a long enough value, so no input is matched with it.
#pragma once

#include <string_view>

namespace trellis::text {

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters (a Kubernetes DNS-1123 label).
bool IsDns1123Label(std::string_view s);
// Labels joined by '.', at most 253 characters (a Kubernetes object name).
bool IsDns1123Subdomain(std::string_view s);
// [-+]?[0-9]+
bool IsIntText(std::string_view s);
// [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?
bool IsFloatText(std::string_view s);
// A Kubernetes resource quantity: \+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?
bool IsQuantity(std::string_view s);

}  // namespace trellis::text
