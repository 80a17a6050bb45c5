#include "common/job/yaml_emit.h"

#include <cstdio>
#include <cstdlib>
#include <set>

namespace trellis::yaml {
namespace {

// Starts with a letter, '_' or '/', then only [A-Za-z0-9_./-], and is none of the YAML 1.1
// booleans or nulls (Kubernetes' go-yaml still reads "on" and "yes" as true).
bool SafePlain(const std::string& s) {
  static const std::set<std::string> words = {
      "y",    "Y",    "yes",  "Yes",   "YES",   "n",     "N",    "no",  "No",
      "NO",   "true", "True", "TRUE",  "false", "False", "FALSE", "on", "On",
      "ON",   "off",  "Off",  "OFF",   "null",  "Null",  "NULL"};
  if (s.empty() || words.count(s) != 0) return false;
  auto first = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == '/'; };
  auto rest = [&](char c) { return first(c) || (c >= '0' && c <= '9') || c == '.' || c == '-'; };
  if (!first(s[0])) return false;
  for (char c : s) {
    if (!rest(c)) return false;
  }
  return true;
}

}  // namespace

void EmitString(YAML::Emitter& out, const std::string& s) {
  if (SafePlain(s)) {
    out << s;
  } else {
    out << YAML::DoubleQuoted << s;
  }
}

void EmitNode(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      out << YAML::Null;
      return;
    case YAML::NodeType::Scalar: {
      const std::string& tag = node.Tag();
      if (tag == "?") {
        out << node.Scalar();  // plain stays plain (the emitter quotes only if it must)
      } else if (tag == "!" || tag == "tag:yaml.org,2002:str") {
        EmitString(out, node.Scalar());
      } else {
        out << YAML::VerbatimTag(tag) << node.Scalar();
      }
      return;
    }
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) EmitNode(out, item);
      out << YAML::EndSeq;
      return;
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (auto it = node.begin(); it != node.end(); ++it) {
        out << YAML::Key;
        EmitNode(out, it->first);
        out << YAML::Value;
        EmitNode(out, it->second);
      }
      out << YAML::EndMap;
      return;
  }
}

std::string NodeToYaml(const YAML::Node& node) {
  YAML::Emitter out;
  EmitNode(out, node);
  return out.c_str();
}

std::string FormatDouble(double v) {
  char buf[40];
  for (int precision = 15; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace trellis::yaml
