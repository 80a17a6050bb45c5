// A role's optional pod template (spec.<role>.template, kept by the job model as YAML text)
// merged into the pods the operator builds. The template is the base; what the operator sets
// wins: labels/annotations are added under ours, spec fields (nodeSelector, tolerations,
// affinity, serviceAccountName, ...) are kept unless the operator sets them, the template's
// container named "trellis" (or its first unnamed one) is merged under the operator's container
// (its env, volumeMounts and ports added by name), other containers (sidecars) and volumes
// are added.
#pragma once

#include <string>

#include "common/base/status.h"
#include "operator/json_util.h"

namespace trellis::op {

// YAML text -> JSON. Plain scalars become null, booleans, integers or numbers when they read as
// such; quoted scalars stay strings.
StatusOr<Json> YamlToJson(const std::string& yaml_text);

// `over` on top of `base`: objects merged key by key (recursively), anything else from `over`.
Json MergeUnder(const Json& base, const Json& over);

// Returns `pod` with `template_yaml` merged in as described above; an empty template returns
// `pod`. Errors: a template that is not a mapping or not valid YAML.
StatusOr<Json> ApplyPodTemplate(const Json& pod, const std::string& template_yaml);

}  // namespace trellis::op
