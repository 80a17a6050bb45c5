// The job token (and any other unguessable name): made here only, by the operator (the job's
// Secret), trellis-launch (the run's token file) and the operator's Lease identity.
#pragma once

#include <cstddef>
#include <string>

#include "common/base/status.h"

namespace trellis {

// 32 bytes: a job token guards a job's scheduler and data ports, and 256 bits is what a bearer
// secret needs to be beyond guessing for any lifetime (the operator's tokens always had 32 bytes;
// trellis-launch's had 16 before there was one maker).
inline constexpr size_t kRandomTokenBytes = 32;

// kRandomTokenBytes bytes from /dev/urandom as lower-case hex (64 characters).
StatusOr<std::string> RandomToken();

}  // namespace trellis
