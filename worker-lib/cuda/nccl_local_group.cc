#include "worker-lib/cuda/nccl_local_group.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "worker-lib/cuda/twobit_cuda.h"

namespace trellis {
namespace {

Status CudaError(const char* what, cudaError_t e) {
  return InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}
Status NcclError(const char* what, ncclResult_t r) {
  return InternalError(std::string(what) + ": " + ncclGetErrorString(r));
}

// A device buffer that only grows.
class DeviceBuffer {
 public:
  ~DeviceBuffer() {
    if (p_ != nullptr) cudaFree(p_);
  }
  StatusOr<float*> Get(size_t floats) {
    if (floats > cap_) {
      if (p_ != nullptr) cudaFree(p_);
      p_ = nullptr;
      cap_ = 0;
      if (cudaError_t e = cudaMalloc(&p_, floats * sizeof(float)); e != cudaSuccess) {
        return CudaError("cudaMalloc", e);
      }
      cap_ = floats;
    }
    return static_cast<float*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

class NcclLocalGroup final : public LocalGroup {
 public:
  NcclLocalGroup(const LocalGroupOptions& o, ncclComm_t comm, cudaStream_t stream)
      : o_(o), comm_(comm), stream_(stream) {}
  ~NcclLocalGroup() override {
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return o_.rank; }
  int size() const override { return o_.size; }
  const char* kind() const override { return "nccl"; }

  // NCCL wants equal parts: part p sits at p * stride (stride = the longest part), padded.
  Status ReduceScatter(const float* in, int64_t n, float* part) override {
    const int64_t stride = LocalPart(n, o_.size, 0).count;
    TRELLIS_ASSIGN_OR_RETURN(float* send, send_.Get(stride * o_.size));
    TRELLIS_ASSIGN_OR_RETURN(float* recv, recv_.Get(stride));
    if (auto e = cudaMemsetAsync(send, 0, stride * o_.size * sizeof(float), stream_); e) {
      return CudaError("cudaMemsetAsync", e);
    }
    for (int p = 0; p < o_.size; ++p) {
      const PartRange pr = LocalPart(n, o_.size, p);
      if (pr.count == 0) continue;
      if (auto e = cudaMemcpyAsync(send + p * stride, in + pr.begin, pr.count * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_); e) {
        return CudaError("cudaMemcpyAsync", e);
      }
    }
    if (auto r = ncclReduceScatter(send, recv, stride, ncclFloat32, ncclSum, comm_, stream_); r) {
      return NcclError("ncclReduceScatter", r);
    }
    const PartRange mine = LocalPart(n, o_.size, o_.rank);
    if (mine.count > 0) {
      if (auto e = cudaMemcpyAsync(part, recv, mine.count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_); e) {
        return CudaError("cudaMemcpyAsync", e);
      }
    }
    return Finish("ReduceScatter");
  }

  Status AllGather(const float* part, int64_t n, float* out) override {
    const int64_t stride = LocalPart(n, o_.size, 0).count;
    TRELLIS_ASSIGN_OR_RETURN(float* send, send_.Get(stride));
    TRELLIS_ASSIGN_OR_RETURN(float* recv, recv_.Get(stride * o_.size));
    const PartRange mine = LocalPart(n, o_.size, o_.rank);
    if (mine.count > 0) {
      if (auto e = cudaMemcpyAsync(send, part, mine.count * sizeof(float),
                                   cudaMemcpyHostToDevice, stream_); e) {
        return CudaError("cudaMemcpyAsync", e);
      }
    }
    if (auto r = ncclAllGather(send, recv, stride, ncclFloat32, comm_, stream_); r) {
      return NcclError("ncclAllGather", r);
    }
    for (int p = 0; p < o_.size; ++p) {
      const PartRange pr = LocalPart(n, o_.size, p);
      if (pr.count == 0) continue;
      if (auto e = cudaMemcpyAsync(out + pr.begin, recv + p * stride, pr.count * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_); e) {
        return CudaError("cudaMemcpyAsync", e);
      }
    }
    return Finish("AllGather");
  }

  Status Broadcast(float* data, int64_t n, int root) override {
    if (root < 0 || root >= o_.size) {
      return InvalidArgumentError("local broadcast root " + std::to_string(root) + " outside [0, " +
                                  std::to_string(o_.size) + ")");
    }
    TRELLIS_ASSIGN_OR_RETURN(float* buf, send_.Get(n));
    if (o_.rank == root) {
      if (auto e = cudaMemcpyAsync(buf, data, n * sizeof(float), cudaMemcpyHostToDevice, stream_);
          e) {
        return CudaError("cudaMemcpyAsync", e);
      }
    }
    if (auto r = ncclBroadcast(buf, buf, n, ncclFloat32, root, comm_, stream_); r) {
      return NcclError("ncclBroadcast", r);
    }
    if (auto e = cudaMemcpyAsync(data, buf, n * sizeof(float), cudaMemcpyDeviceToHost, stream_);
        e) {
      return CudaError("cudaMemcpyAsync", e);
    }
    return Finish("Broadcast");
  }

 private:
  // Waits for the stream, bounded: a peer that never joins would block NCCL forever, so past
  // the deadline the communicator is aborted and the call fails.
  Status Finish(const char* what) {
    if (comm_ == nullptr) return FailedPreconditionError("NCCL local group aborted earlier");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(o_.timeout_ms);
    while (true) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady) return CudaError(what, e);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) return NcclError(what, async);
      if (std::chrono::steady_clock::now() >= deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return DeadlineExceededError(std::string("local group ") + o_.name + ": NCCL " + what +
                                     " not done within " + std::to_string(o_.timeout_ms) + " ms");
      }
      std::this_thread::yield();
    }
  }

  const LocalGroupOptions o_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  DeviceBuffer send_, recv_;
};

}  // namespace

StatusOr<std::unique_ptr<LocalGroup>> OpenNcclLocalGroup(const LocalGroupOptions& o) {
  const int devices = CudaDeviceCount();
  if (devices < 1) return FailedPreconditionError("NCCL local group: no CUDA device");
  if (auto e = cudaSetDevice(o.rank % devices); e) return CudaError("cudaSetDevice", e);
  // Rank 0 makes the id; if that fails it returns without publishing and the others fail at
  // their exchange deadline.
  ncclUniqueId id{};
  std::string mine;
  if (o.rank == 0) {
    if (auto r = ncclGetUniqueId(&id); r) return NcclError("ncclGetUniqueId", r);
    mine.assign(reinterpret_cast<const char*>(&id), sizeof id);
  }
  if (!o.exchange_key) return InvalidArgumentError("NCCL local group: no exchange_key");
  TRELLIS_ASSIGN_OR_RETURN(std::string got, o.exchange_key(o.name + "/" + o.channel, o.rank, mine));
  if (got.size() != sizeof id) {
    return InvalidArgumentError("NCCL local group " + o.name + ": unique id of " +
                                std::to_string(got.size()) + " bytes, want " +
                                std::to_string(sizeof id));
  }
  std::memcpy(&id, got.data(), sizeof id);
  ncclComm_t comm = nullptr;
  if (auto r = ncclCommInitRank(&comm, o.size, id, o.rank); r) {
    return NcclError("ncclCommInitRank", r);
  }
  cudaStream_t stream = nullptr;
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e) {
    ncclCommDestroy(comm);
    return CudaError("cudaStreamCreate", e);
  }
  return std::unique_ptr<LocalGroup>(new NcclLocalGroup(o, comm, stream));
}

}  // namespace trellis
