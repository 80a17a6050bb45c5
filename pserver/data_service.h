// The parameter server's gRPC face: InstallShardMap and HandOver (unary) and Stream, a raw
// byte-buffer bidirectional stream per worker (frames in datapath/frame.h).
//
// Each admitted stream is a server link (datapath/grpc/server_link.h: reads, writes, bounds) with
// a front door above it (pserver/front_door.h, as for the TCP listener), which serves its requests
// through the server's serving queue highest priority first and sums straight out of the received
// slices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "pserver/serving_queue.h"
#include "pserver/slice_store.h"
#include "trellis/v1/data.grpc.pb.h"

namespace trellis {

struct DataServiceOptions {
  std::string token;      // expected in "x-trellis-token"; empty: no check
  // The serving queue's pool, shared by both transports (ParameterServer makes it).
  int pool_threads = 0;   // 0: one per core
  size_t inline_max_bytes = 64 << 10;  // serve payloads up to this size inline when idle
  // Per stream: requests read and not served yet, and answer bytes not sent yet (against
  // `bytes`); past either the stream's next read waits.
  ReadAheadLimit read_ahead;
};

using DataServiceBase = v1::DataService::WithCallbackMethod_InstallShardMap<
    v1::DataService::WithCallbackMethod_HandOver<
        v1::DataService::WithRawCallbackMethod_Stream<v1::DataService::Service>>>;

class DataService final : public DataServiceBase {
 public:
  // `store` and `serving` outlive the service.
  DataService(SliceStore* store, ServingQueue* serving, DataServiceOptions options);
  ~DataService() override;

  // Fails waiting pulls; call after stopping `serving`, before grpc::Server::Shutdown.
  void Stop();

  grpc::ServerUnaryReactor* InstallShardMap(grpc::CallbackServerContext* ctx,
                                            const v1::InstallShardMapRequest* req,
                                            v1::InstallShardMapResponse* resp) override;
  // A server resize (pserver/slice_handover.h): one handout or handin frame from a worker.
  grpc::ServerUnaryReactor* HandOver(grpc::CallbackServerContext* ctx,
                                     const v1::HandOverRequest* req,
                                     v1::HandOverResponse* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override;

 private:
  SliceStore* const store_;
  ServingQueue* const serving_;
  const DataServiceOptions options_;
};

}  // namespace trellis
