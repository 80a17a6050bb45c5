// Writing YAML that reads back the same: quoted scalars stay quoted (a pod template's "1" must
// stay a string), numbers are printed with the fewest digits that round-trip.
#pragma once

#include <string>

#include <yaml-cpp/yaml.h>

namespace trellis::yaml {

// Emits `node` (block style), keeping each scalar's quoting and explicit tags.
void EmitNode(YAML::Emitter& out, const YAML::Node& node);
// Emits a string that must read back as a string: plain when no YAML 1.1 or 1.2 reader could
// take it for anything else (mlp, /ckpt, app.kubernetes.io/name), double-quoted otherwise
// ("1", "yes", "~", "", "a: b").
void EmitString(YAML::Emitter& out, const std::string& s);
// EmitNode of a whole document, as text.
std::string NodeToYaml(const YAML::Node& node);
// The shortest decimal that strtod reads back as exactly `v` ("0.01", "1e-08", "300").
std::string FormatDouble(double v);

}  // namespace trellis::yaml
