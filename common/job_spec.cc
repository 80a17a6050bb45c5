// Placeholder until the job-model work lands: keeps the tree building.
#include "common/job_spec.h"
