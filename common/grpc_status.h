// Conversions between trellis::Status and grpc::Status (same code numbers).
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace trellis {

inline grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

inline Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

}  // namespace trellis
