// Parsing of spec.runPolicy.schedulingPolicy, the part of the job model that only the operator
// acts on (gang scheduling, queue, priority). Internal to ParseJobSpec (common/job/job_spec.cc); kept
// apart so the job parser stays one file per concern.
#pragma once

#include "common/job/job_spec.h"
#include "common/job/yaml_fields.h"

namespace trellis {

// Reads `run`'s "schedulingPolicy" into *out, recording every problem in run.errors().
void ParseSchedulingPolicy(const yaml::MapReader& run, SchedulingPolicySpec* out);

}  // namespace trellis
