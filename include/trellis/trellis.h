// Trellis worker library: the public C++ API a training program uses.
//
//   auto worker = trellis::Worker::Create();            // cluster from the environment
//   if (!worker.ok()) { ...worker.status()... }
//   (*worker)->DeclareKey({.id = 0, .name = "fc1.weight", .num_elements = n});
//   (*worker)->FinishDeclarations();                    // collective: all workers, same keys
//   (*worker)->Broadcast(0, params, 0).Wait();          // everyone starts from rank 0's values
//   for each step:
//     backward layer L done -> handles[L] = (*worker)->PushPull(L, grad_L, sum_L, /*priority=*/-L);
//     before the next forward of layer L: handles[L].Wait();
//
// Everything here is thread-safe unless noted. Errors are values (trellis::Status); nothing
// throws. This header and trellis/c_api.h are the only headers users include.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "trellis/status.h"

namespace trellis {

using KeyId = uint64_t;

enum class DType : int32_t { kFloat32 = 1 };

// How a key's pushes travel (docs/compression.md). Answers are float32 either way.
enum class WireType : int32_t {
  kJob = 0,       // as the job's spec.compression says (none, 2bit, fp16, bf16)
  kFloat16 = 1,   // float16 values, whatever the job says; the servers sum in float32
  kBFloat16 = 2,  // bfloat16 values, likewise
};

struct KeyDecl {
  KeyId id = 0;              // unique per job
  std::string name;          // optional, used in messages and checkpoints
  int64_t num_elements = 0;  // >= 1
  DType dtype = DType::kFloat32;
  // false: this key's pushes are always full precision, whatever the job's compression (for
  // values that must sum exactly: counters, statistics).
  bool allow_compression = true;
  // With allow_compression: this key's 16-bit type on the wire, or the job's setting.
  WireType wire = WireType::kJob;
};

// Elastic jobs (docs/elastic.md): the workers taking part in the job's steps from `from_step`
// on, and this worker's place among them (rank() and size() say the same).
struct WorldView {
  int64_t epoch = 0;      // 0: the world the job started with; +1 per resize
  int64_t from_step = 1;  // its first step (a key's step n is its n-th push)
  int rank = 0;           // this worker's index among the members: 0..size-1
  int size = 1;
  bool left = false;      // this worker is not in it: stop training and exit 0
  // The ranks the job has for its life (the workers it started with): no world is larger. A
  // program that keeps something per rank (a key each) sizes it by this, so a worker that
  // joins or restarts in a smaller world declares the same keys as the others. 0: not known
  // (a worker of another kind); use size.
  int slots = 0;
};

// The job's gradient compression as seen by one worker (all zero without compression).
struct CompressionStats {
  uint64_t bytes_in = 0;     // gradient bytes of the compressed pushes (float32)
  uint64_t bytes_out = 0;    // what they were sent as (2-bit frames)
  uint64_t nanoseconds = 0;  // time spent compressing
  // Answers that came back packed (spec.compression.packedPulls): their float32 size, and the
  // bytes they took on the wire (both also in bytes_pulled()'s count: the wire bytes).
  uint64_t pulled_unpacked_bytes = 0;
  uint64_t pulled_packed_bytes = 0;
};

// Overrides for what the environment and the job file say (flag > environment > job > default).
// Zero / empty means "not set here".
struct WorkerOptions {
  std::string scheduler_address;  // else TRELLIS_SCHEDULER
  std::string token_file;          // else TRELLIS_TOKEN_FILE
  int32_t rank = -1;               // else TRELLIS_RANK
  int64_t slice_bytes = 0;         // else the job's sliceBytes
  int32_t water_mark = 0;          // else the job's priority.waterMark
  int64_t timeout_ms = 0;          // per-operation deadline; else 120000
  std::string transport;           // data path: "grpc" or "tcp"; else the job's spec.transport
  // Elastic jobs (docs/elastic.md#growing): a worker created outside the job's world joins a
  // grow under way, taking the running job's model through its Checkpointer. false: it stays
  // out (world().left), for a program that cannot take the running job's state; its exit before
  // joining gives the grow up.
  bool join_grows = true;
};

// The job's spec.checkpoint as the worker received it (trellis/checkpoint.h uses it).
struct CheckpointConfig {
  std::string path;            // directory; empty: checkpoints off
  int64_t interval_steps = 0;  // 0: only when the program asks
  int32_t keep = 3;            // newest checkpoints kept
  bool servers_save = false;   // update mode: servers save their shards with optimizer state
};

// Completion of an asynchronous operation. Copyable; all copies observe the same operation.
class Handle {
 public:
  Handle();  // an already-completed OK handle
  // Blocks until the operation is done; returns its status. For an operation of at most 64 KiB
  // it polls for up to 50 us first (a sleeping core's wake-up costs more than that answer).
  Status Wait() const;
  // True once done (never blocks).
  bool Done() const;

  struct State;  // internal
  explicit Handle(std::shared_ptr<State> state);
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

// Called once when the operation completes, on a library thread: keep it short, and never
// wait on another handle in it (that handle's slices may be sent by this very thread).
using Callback = std::function<void(const Status&)>;

class Worker {
 public:
  // Joins the job described by the environment (TRELLIS_SCHEDULER, TRELLIS_RANK, ...).
  static StatusOr<std::unique_ptr<Worker>> Create(const WorkerOptions& options = {});
  virtual ~Worker();

  // This worker's rank among the workers taking part now, and how many they are. In an elastic
  // job both change at a step boundary (Checkpointer::EndStep or Commit): see world().
  virtual int rank() const = 0;
  virtual int size() const = 0;         // number of workers
  // Elastic jobs (docs/elastic.md): the world this worker is in; it changes only inside the
  // Checkpointer's EndStep/Commit. A program compares `epoch` after each of them to re-shard its
  // data (and rescale its learning rate); `left`: stop and exit 0. Fixed-size jobs: epoch 0.
  virtual WorldView world() const = 0;
  virtual int num_servers() const = 0;
  virtual const CheckpointConfig& checkpoint_config() const = 0;

  // Declares a key. Every worker declares the same keys (id, element count, dtype).
  // Also after FinishDeclarations (deferred init: a layer whose shape is known only at its first
  // forward pass); such keys are usable after the next FinishDeclarations.
  virtual Status DeclareKey(const KeyDecl& key) = 0;
  // Collective: sends this worker's declarations to the scheduler and waits for the shard map.
  // A mismatch between workers fails here on every worker with a message naming the key.
  // Called again after declaring more keys, it extends the map: every worker must declare the
  // same new keys; if some worker does not within the timeout, every worker that did gets an
  // error naming the keys and the workers missing. Then Broadcast the new keys' first values.
  virtual Status FinishDeclarations() = 0;

  // Sums `grad` over all workers for this key's next step and writes the result to `out`
  // (aggregate mode: the sum; update mode: the new weights). `grad` must stay valid and
  // unchanged, and `out` untouched, until the handle completes. `grad` may equal `out`.
  // Higher priority is sent first (default scheme: priority = -layer index).
  virtual Handle PushPull(KeyId key, const float* grad, float* out, int priority = 0,
                          Callback done = nullptr) = 0;
  // The two halves, for programs that separate them.
  virtual Handle Push(KeyId key, const float* grad, int priority = 0, Callback done = nullptr) = 0;
  virtual Handle Pull(KeyId key, float* out, int priority = 0, Callback done = nullptr) = 0;

  // Every worker ends with `root`'s values of the key in `data` (also seeds the servers' copy
  // of the key: initial weights in update mode).
  virtual Handle Broadcast(KeyId key, float* data, int root = 0) = 0;

  // Blocks until every worker reached the barrier of this name.
  virtual Status Barrier(const std::string& name) = 0;

  // Payload bytes this rank sent and received so far (a killed program's too: user-guide.md#byte-totals).
  virtual uint64_t bytes_pushed() const = 0;
  virtual uint64_t bytes_pulled() const = 0;
  // Compression of pushes so far (the job's spec.compression; see docs/compression.md).
  virtual CompressionStats compression_stats() const = 0;

  // Training progress (docs/user-guide.md#progress): call once per step, after it, with the
  // step's number (>= 0, counting as you like), the samples this worker processed in it (0: not
  // known) and its loss (NaN: none). Cheap: it only records; a library thread sends what was
  // recorded to the scheduler about once a second, so the job's status shows step, samples/s,
  // ETA, loss and which worker is a straggler. Errors only for negative step or samples.
  virtual Status ReportProgress(int64_t step, int64_t samples = 0,
                                double loss = std::numeric_limits<double>::quiet_NaN()) = 0;
  // The number of steps the job will run (> 0), for the ETA; 0: not known (the default).
  virtual Status SetTotalSteps(int64_t total_steps) = 0;
};

}  // namespace trellis
