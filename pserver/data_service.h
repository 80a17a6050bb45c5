// The parameter server's gRPC face: InstallShardMap (unary) and Stream, a raw byte-buffer
// bidirectional stream per worker (frames in pserver/wire.h).
//
// Threads: gRPC's callback threads read frames, decode headers and queue the requests; a small
// pool ("pserver-pool", one thread per core) serves the queue highest priority first (FIFO
// within a priority) and sums straight out of the received slices. Small requests are served
// inline on the gRPC thread when nothing is queued (no hand-off latency). Answers go out on
// the worker's stream, highest priority first, referencing the result buffers (no copy).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "pserver/slice_store.h"
#include "trellis/v1/data.grpc.pb.h"

namespace trellis {

struct DataServiceOptions {
  std::string token;      // expected in "x-trellis-token"; empty: no check
  int pool_threads = 0;   // 0: one per core
  size_t inline_max_bytes = 64 << 10;  // serve payloads up to this size inline when idle
};

using DataServiceBase = v1::DataService::WithCallbackMethod_InstallShardMap<
    v1::DataService::WithRawCallbackMethod_Stream<v1::DataService::Service>>;

class DataService final : public DataServiceBase {
 public:
  // `store` outlives the service.
  DataService(SliceStore* store, DataServiceOptions options);
  ~DataService() override;

  // Fails waiting pulls and stops the pool; call before grpc::Server::Shutdown.
  void Stop();

  grpc::ServerUnaryReactor* InstallShardMap(grpc::CallbackServerContext* ctx,
                                            const v1::InstallShardMapRequest* req,
                                            v1::InstallShardMapResponse* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Stream(
      grpc::CallbackServerContext* ctx) override;

  struct StreamState;  // internal
  struct Task {
    int32_t priority;
    uint64_t seq;
    std::shared_ptr<StreamState> stream;
    wire::RequestHeader header;
    std::vector<grpc::Slice> slices;
    size_t offset = 0;  // a bulk entry: its bytes [offset, offset + bytes) of `slices`
    size_t bytes = 0;   // 0: the whole frame
    bool operator<(const Task& o) const {  // max-heap: higher priority, then lower seq first
      return priority != o.priority ? priority < o.priority : seq > o.seq;
    }
  };

  // Called by a stream's reactor (any thread).
  void Submit(Task task, size_t payload_bytes);
  void Serve(Task& task);
  Status CheckToken(const grpc::CallbackServerContext* ctx) const;
  SliceStore* store() const { return store_; }

 private:
  void PoolLoop();

  SliceStore* const store_;
  const DataServiceOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Task> queue_;  // GUARDED_BY(mu_)
  uint64_t seq_ = 0;                 // GUARDED_BY(mu_)
  int busy_ = 0;                     // GUARDED_BY(mu_): pool threads serving a task
  bool stopping_ = false;            // GUARDED_BY(mu_)
  std::vector<std::thread> pool_;
};

}  // namespace trellis
