// Conversions between trellis::Status and grpc::Status (same code numbers), and a call's
// metadata as a server reads it.
#pragma once

#include <string>

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include "common/base/status.h"

namespace trellis {

inline grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

inline Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<StatusCode>(s.error_code()), s.error_message());
}

// The value a client sent under `key` ("" when absent).
inline std::string ClientMetadata(const grpc::ServerContextBase& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return {};
  return std::string(it->second.data(), it->second.size());
}

}  // namespace trellis
