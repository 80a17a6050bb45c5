// Status and StatusOr are part of the public worker API (trellis/status.h); internal code
// includes them through here.
#pragma once

#include "trellis/status.h"
