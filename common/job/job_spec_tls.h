// spec.tls of the job model (common/job/job_spec.h TlsSpec), parsed apart from the rest of the spec.
#pragma once

#include "common/job/job_spec.h"
#include "common/job/yaml_fields.h"

namespace trellis {

// Reads spec.tls into `out`, recording every problem in `spec`'s error list.
void ParseTlsSpec(const yaml::MapReader& spec, TlsSpec* out);

}  // namespace trellis
