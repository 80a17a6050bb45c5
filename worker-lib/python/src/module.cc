// trellis._trellis: the pybind11 module over trellis::Worker (the pure-Python package `trellis`
// wraps it). Arrays travel without copies through the buffer protocol: the library reads and
// writes the caller's memory, so every operation keeps its buffers exported (and their owners
// alive) until it completes. Waiting releases the GIL; library threads never touch Python.
#include <pybind11/pybind11.h>
#include <pybind11/eval.h>
#include <pybind11/stl.h>

#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/checkpoint/crc32c.h"
#include "trellis/trellis.h"
#include "worker-lib/src/local_group_worker.h"
#include "worker-lib/src/rejoin_keeper.h"
#include "worker-lib/src/worker_impl.h"

namespace py = pybind11;

namespace trellis::python {
namespace {

// The Python class trellis.TrellisError (defined in the module init below).
py::object& ErrorClass() {
  static py::object* cls = new py::object();  // leaked on purpose: outlives interpreter teardown
  return *cls;
}

// Raises trellis.TrellisError(code, code_name, message) for a non-OK Status.
[[noreturn]] void Raise(const Status& s) {
  py::object err = ErrorClass()(static_cast<int>(s.code()), std::string(StatusCodeName(s.code())),
                                s.message());
  PyErr_SetObject(ErrorClass().ptr(), err.ptr());
  throw py::error_already_set();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

// Runs `f` (a blocking library call) with the GIL released, then raises its error.
template <typename F>
void CheckWithoutGil(F&& f) {
  Status s;
  {
    py::gil_scoped_release nogil;
    s = f();
  }
  Check(s);
}

// An in-flight operation: the C++ handle plus what must stay alive until it is done.
class PyHandle {
 public:
  PyHandle(Handle h, std::vector<std::unique_ptr<py::buffer_info>> buffers,
           std::vector<py::object> owners, py::object result)
      : handle_(std::move(h)),
        buffers_(std::move(buffers)),
        owners_(std::move(owners)),
        result_(std::move(result)) {}

  // Runs with the GIL held (Python deallocation). A handle dropped before completion must not
  // free memory the library still writes to: wait first.
  ~PyHandle() {
    if (!buffers_.empty() && !handle_.Done()) {
      py::gil_scoped_release nogil;
      (void)handle_.Wait();
    }
  }

  // Blocks (without the GIL) until done; returns the output array, raises on error.
  py::object Wait() {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = handle_.Wait();
    }
    buffers_.clear();  // done: the library no longer touches them
    owners_.clear();
    Check(s);
    return result_;
  }
  bool Done() const { return handle_.Done(); }

 private:
  Handle handle_;
  std::vector<std::unique_ptr<py::buffer_info>> buffers_;
  std::vector<py::object> owners_;  // the worker (outlives its operations) and the arrays
  py::object result_;
};

struct KeyInfo {
  int64_t num_elements;
  std::string name;
};

// Owns the C++ worker. All members are touched only with the GIL held (the GIL is the lock).
class PyWorker {
 public:
  explicit PyWorker(std::unique_ptr<Worker> w) : worker_(std::move(w)) {}
  // Called with the GIL held; the keeper's watcher may need the GIL (its prepare) to finish.
  ~PyWorker() {
    py::gil_scoped_release nogil;
    rejoin_.reset();
    worker_.reset();
  }
  PyWorker(const PyWorker&) = delete;
  PyWorker& operator=(const PyWorker&) = delete;

  static std::shared_ptr<PyWorker> Create(const std::string& scheduler_address,
                                          const std::string& token_file, int rank,
                                          int64_t slice_bytes, int water_mark,
                                          int64_t timeout_ms, bool join_grows) {
    WorkerOptions o;
    o.scheduler_address = scheduler_address;
    o.token_file = token_file;
    o.rank = rank;
    o.slice_bytes = slice_bytes;
    o.water_mark = water_mark;
    o.timeout_ms = timeout_ms;
    // Created outside an elastic job's world, the worker joins a grow under way when its program
    // can take the running job's state (trellis.torch's rejoin keeper, trellis/_rejoin.py:
    // docs/elastic.md#pytorch); else, and outside any grow, it stays out and trellis.init()
    // exits 0.
    o.join_grows = join_grows;
    StatusOr<std::unique_ptr<Worker>> w = InternalError("unset");
    {
      py::gil_scoped_release nogil;  // waits for the whole cluster
      w = Worker::Create(o);
    }
    if (!w.ok()) Raise(w.status());
    return std::make_shared<PyWorker>(std::move(w).value());
  }

  Worker& w() {
    if (!worker_) Raise(FailedPreconditionError("trellis worker is closed"));
    return *worker_;
  }

  void Close() {
    std::unique_ptr<Worker> w = std::move(worker_);
    py::gil_scoped_release nogil;  // joins library threads
    rejoin_.reset();  // uses the worker: goes first
    w.reset();
  }

  // Crash recovery for trellis.torch (trellis/_rejoin.py; worker-lib/src/rejoin_keeper.h):
  // `params` is a list of (name, key, float32 buffer) on their declared keys, `state` one float32
  // buffer on `state_key`. The buffers stay exported (and alive) until rejoin_stop or close.
  // `prepare` (a callable taking the step, or None): the keeper's live mode (rejoin_keeper.h),
  // called on the keeper's thread with the GIL to fill `state` just before a serve.
  void RejoinStart(py::list params, int64_t state_key, py::buffer state, py::object prepare) {
    auto* impl = dynamic_cast<WorkerImpl*>(&w());
    if (impl == nullptr || !impl->setup().request_rejoin) {
      Raise(FailedPreconditionError("rejoin: this worker has no scheduler rejoin calls"));
    }
    if (rejoin_) Raise(FailedPreconditionError("rejoin: already started"));
    std::vector<TensorRef> refs;
    for (py::handle item : params) {
      auto t = item.cast<py::tuple>();
      const auto key = t[1].cast<int64_t>();
      auto buf = py::reinterpret_borrow<py::buffer>(t[2]);
      rejoin_bufs_.push_back(Export(buf, true, "rejoin", key));
      rejoin_owners_.push_back(buf);
      refs.push_back({.name = t[0].cast<std::string>(),
                      .data = static_cast<float*>(rejoin_bufs_.back()->ptr),
                      .num_elements = static_cast<int64_t>(rejoin_bufs_.back()->size),
                      .key = static_cast<KeyId>(key)});
    }
    rejoin_bufs_.push_back(Export(state, true, "rejoin state", state_key));
    rejoin_owners_.push_back(state);
    RejoinKeeper::Prepare fill;
    if (!prepare.is_none()) {
      // rejoin_owners_ keeps the callable alive while the keeper lives; the keeper is destroyed
      // without the GIL, so its function must not own a Python reference.
      rejoin_owners_.push_back(prepare);
      fill = [fn = prepare.ptr()](int64_t step) -> Status {
        if (_Py_IsFinalizing()) return UnavailableError("the Python interpreter is exiting");
        py::gil_scoped_acquire gil;
        try {
          py::handle callable(fn);
          callable(step);
          return Status::Ok();
        } catch (py::error_already_set& e) {
          return InternalError(e.what());
        }
      };
    }
    rejoin_ = std::make_unique<RejoinKeeper>(*impl, refs, static_cast<KeyId>(state_key),
                                             static_cast<float*>(rejoin_bufs_.back()->ptr),
                                             static_cast<int64_t>(rejoin_bufs_.back()->size),
                                             std::move(fill));
  }

  // The whole job is being stopped from outside (the scheduler's pings carry StopJob):
  // trellis.torch's rank 0 writes its exit checkpoint at the next step (trellis/_exit_checkpoint.py).
  bool JobStopping() {
    auto* impl = SchedulerWorkerOf(w());
    return impl != nullptr && impl->setup().job_stopping && impl->setup().job_stopping();
  }

  // Tells the scheduler of a checkpoint file rank 0 wrote or restored; step 0 and no path: that
  // rank 0 writes exit checkpoints. Returns the error's words ("" when told): a scheduler that
  // does not hear of it only shows an older checkpoint, so the caller logs it, nothing more.
  std::string ReportCheckpoint(int64_t step, const std::string& path, bool on_exit, bool restored,
                               bool exit_ready) {
    auto* impl = SchedulerWorkerOf(w());
    if (impl == nullptr || !impl->setup().report_checkpoint) return "";
    v1::ReportCheckpointRequest req;
    req.set_step(step);
    req.set_path(path);
    req.set_on_exit(on_exit);
    req.set_restored(restored);
    req.set_exit_ready(exit_ready);
    Status told;
    {
      py::gil_scoped_release nogil;  // one RPC to the scheduler
      told = impl->setup().report_checkpoint(req);
    }
    return told.ok() ? std::string() : told.ToString();
  }

  // The job's per-operation timeout (TRELLIS_TIMEOUT_MS; what a rank 0 that is never stopped
  // waits after its exit checkpoint).
  int64_t TimeoutMs() {
    auto* impl = SchedulerWorkerOf(w());
    return impl == nullptr ? 120000 : impl->setup().timeout_ms;
  }

  // Elastic jobs (docs/elastic.md): the step boundary after `step`, where a resize is reported
  // or takes effect; trellis.torch calls it after each optimizer step. Without the GIL: it may
  // wait for the scheduler's decision and tell the servers the new world.
  void StepBoundary(int64_t step) {
    auto* impl = dynamic_cast<WorkerImpl*>(&w());
    if (impl == nullptr) return;
    CheckWithoutGil([&] { return impl->AtStepBoundary(step); });
  }

  // The world in force: (epoch, from_step, rank, size, left).
  py::tuple World() {
    const WorldView v = w().world();
    return py::make_tuple(v.epoch, v.from_step, v.rank, v.size, v.left);
  }

  // Elastic jobs: the job is elastic (spec.elastic), its worker ranks for life (no world is
  // larger), and the first step of the world this worker joined as a grow's joiner (0: it did
  // not join one; it started in its world).
  bool Elastic() {
    auto* impl = dynamic_cast<WorkerImpl*>(&w());
    return impl != nullptr && impl->setup().reach_step != nullptr;
  }
  int Slots() {
    const WorldView v = w().world();
    return v.slots > 0 ? v.slots : v.size;
  }
  int64_t JoinedFrom() {
    auto* impl = dynamic_cast<WorkerImpl*>(&w());
    return impl == nullptr ? 0 : impl->JoinedFrom();
  }
  // TRELLIS_INCARNATION as the worker read it: > 1 after its agent restarted it.
  int64_t Incarnation() {
    auto* impl = dynamic_cast<WorkerImpl*>(&w());
    return impl == nullptr ? 1 : impl->setup().incarnation;
  }

  RejoinKeeper& keeper() {
    if (!rejoin_) Raise(FailedPreconditionError("rejoin: not started"));
    return *rejoin_;
  }

  // The step boundary (copy mode: a copy of every tracked tensor): without the GIL.
  void RejoinCommit(int64_t step, bool again, bool copy) {
    RejoinKeeper& k = keeper();
    CheckWithoutGil([&] { return k.Commit(step, again, copy); });
  }

  // Live mode: the tracked tensors change until the next commit (waits while a serve runs,
  // whose prepare needs the GIL).
  void RejoinBeginUpdate() {
    RejoinKeeper& k = keeper();
    py::gil_scoped_release nogil;
    k.BeginUpdate();
  }

  // The donor's step (the tracked buffers now hold its commit), or None: nobody has committed
  // yet, start as on a first start. A grow's joiner takes the members' commit of the step before
  // its world's first and tells the servers its world (RejoinKeeper::Rejoin).
  py::object RejoinFetch() {
    RejoinKeeper& k = keeper();
    StatusOr<std::optional<int64_t>> r = InternalError("unset");
    {
      py::gil_scoped_release nogil;
      r = k.Rejoin();
    }
    if (!r.ok()) Raise(r.status());
    return r->has_value() ? py::object(py::int_(**r)) : py::object(py::none());
  }

  void RejoinMarkServers() {
    RejoinKeeper& k = keeper();
    CheckWithoutGil([&] { return k.MarkServersRejoined(); });
  }

  void RejoinStop() {
    {
      py::gil_scoped_release nogil;  // joins the watcher thread
      rejoin_.reset();
    }
    rejoin_bufs_.clear();
    rejoin_owners_.clear();
  }

  // `wire`: "" (the job's compression), "float32" (never compressed), "float16", "bfloat16".
  void DeclareKey(int64_t key, int64_t num_elements, const std::string& name,
                  const std::string& wire) {
    if (key < 0) Raise(InvalidArgumentError("declare: key must be >= 0, got " + std::to_string(key)));
    KeyDecl d{.id = static_cast<KeyId>(key), .name = name, .num_elements = num_elements};
    if (wire == "float32") {
      d.allow_compression = false;
    } else if (wire == "float16") {
      d.wire = WireType::kFloat16;
    } else if (wire == "bfloat16") {
      d.wire = WireType::kBFloat16;
    } else if (!wire.empty()) {
      Raise(InvalidArgumentError("declare: wire '" + wire +
                                 "': want '', 'float32', 'float16' or 'bfloat16'"));
    }
    Check(w().DeclareKey(d));
    keys_[key] = {num_elements, name};
  }

  void FinishDeclarations() {
    Worker& wk = w();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = wk.FinishDeclarations();
    }
    Check(s);
    finished_ = true;
  }

  std::unique_ptr<PyHandle> PushPull(py::object self, int64_t key, py::buffer grad, py::object out,
                                     int priority) {
    Worker& wk = w();
    std::vector<std::unique_ptr<py::buffer_info>> bufs;
    const bool in_place = out.is_none();
    bufs.push_back(Export(grad, /*writable=*/in_place, "push_pull", key));
    float* dst = static_cast<float*>(bufs.back()->ptr);
    if (!in_place) {
      bufs.push_back(Export(py::reinterpret_borrow<py::buffer>(out), true, "push_pull out", key));
      dst = static_cast<float*>(bufs.back()->ptr);
    }
    const float* src = static_cast<const float*>(bufs.front()->ptr);
    py::object result = in_place ? py::object(grad) : out;
    Handle h;
    {
      py::gil_scoped_release nogil;  // the first slices may be sent inline
      h = wk.PushPull(static_cast<KeyId>(key), src, dst, priority);
    }
    return std::make_unique<PyHandle>(std::move(h), std::move(bufs),
                                      std::vector<py::object>{self, grad, out}, result);
  }

  std::unique_ptr<PyHandle> Broadcast(py::object self, int64_t key, py::buffer data, int root) {
    Worker& wk = w();
    std::vector<std::unique_ptr<py::buffer_info>> bufs;
    bufs.push_back(Export(data, true, "broadcast", key));
    float* p = static_cast<float*>(bufs.back()->ptr);
    Handle h;
    {
      py::gil_scoped_release nogil;
      h = wk.Broadcast(static_cast<KeyId>(key), p, root);
    }
    return std::make_unique<PyHandle>(std::move(h), std::move(bufs),
                                      std::vector<py::object>{self, data}, data);
  }

  void Barrier(const std::string& name) {
    Worker& wk = w();
    Status s;
    {
      py::gil_scoped_release nogil;
      s = wk.Barrier(name);
    }
    Check(s);
  }

  bool finished() const { return finished_; }

 private:
  // Exports `b` as a C-contiguous float32 buffer of the key's size (the library only sees a
  // pointer, so the size check lives here).
  std::unique_ptr<py::buffer_info> Export(const py::buffer& b, bool writable, const char* what,
                                          int64_t key) {
    auto info = std::make_unique<py::buffer_info>(b.request(writable));
    const std::string label = std::string(what) + " key " + std::to_string(key);
    const std::string& f = info->format;
    if (info->itemsize != 4 || (f != "f" && f != "<f" && f != "=f")) {
      Raise(InvalidArgumentError(label + ": want a float32 array, got format '" + f +
                                 "' with " + std::to_string(info->itemsize) + "-byte items"));
    }
    py::ssize_t want = info->itemsize;
    for (py::ssize_t d = info->ndim - 1; d >= 0; --d) {
      if (info->shape[d] != 1 && info->strides[d] != want) {
        Raise(InvalidArgumentError(label + ": array is not C-contiguous"));
      }
      want *= info->shape[d];
    }
    auto k = keys_.find(key);
    if (k != keys_.end() && info->size != k->second.num_elements) {
      Raise(InvalidArgumentError(label + " (" + k->second.name + "): array has " +
                                 std::to_string(info->size) + " elements, the key has " +
                                 std::to_string(k->second.num_elements)));
    }
    return info;
  }

  std::unique_ptr<Worker> worker_;
  std::vector<std::unique_ptr<py::buffer_info>> rejoin_bufs_;  // exported while rejoin_ lives
  std::vector<py::object> rejoin_owners_;
  std::unique_ptr<RejoinKeeper> rejoin_;  // after the buffers: destroyed first
  std::map<int64_t, KeyInfo> keys_;
  bool finished_ = false;
};

}  // namespace
}  // namespace trellis::python

PYBIND11_MODULE(_trellis, m) {
  using namespace trellis::python;
  m.doc() = "Trellis worker library (C++ core of the `trellis` package)";

  // TrellisError carries the C++ Status: .code (int, gRPC numbering), .code_name, .message.
  py::dict ns;
  py::exec(R"(
class TrellisError(RuntimeError):
    """An error Status from the Trellis library: .code (int), .code_name, .message."""
    def __init__(self, code, code_name, message):
        super().__init__(message)
        self.code = code
        self.code_name = code_name
        self.message = message
    def __str__(self):
        return self.message
)",
           py::globals(), ns);
  ErrorClass() = ns["TrellisError"];
  ErrorClass().attr("__module__") = "trellis";
  m.attr("TrellisError") = ErrorClass();

  // CRC32C of a bytes object: trellis.torch's checkpoint files use the same checksum as the C++
  // checkpoint format (docs/checkpoints.md).
  m.def(
      "crc32c",
      [](py::bytes data, uint32_t crc) {
        std::string_view v = data;
        return trellis::Crc32cExtend(crc, v.data(), v.size());
      },
      py::arg("data"), py::arg("crc") = 0);

  py::class_<PyHandle>(m, "Handle")
      .def("wait", &PyHandle::Wait,
           "Blocks until the operation completes (GIL released); returns the output array")
      .def("done", &PyHandle::Done);

  py::class_<PyWorker, std::shared_ptr<PyWorker>>(m, "Worker")
      .def_static("create", &PyWorker::Create, py::arg("scheduler_address") = "",
                  py::arg("token_file") = "", py::arg("rank") = -1, py::arg("slice_bytes") = 0,
                  py::arg("water_mark") = 0, py::arg("timeout_ms") = 0,
                  py::arg("join_grows") = false)
      .def_property_readonly("rank", [](PyWorker& w) { return w.w().rank(); })
      .def_property_readonly("size", [](PyWorker& w) { return w.w().size(); })
      .def_property_readonly("num_servers", [](PyWorker& w) { return w.w().num_servers(); })
      .def_property_readonly("bytes_pushed", [](PyWorker& w) { return w.w().bytes_pushed(); })
      .def_property_readonly("bytes_pulled", [](PyWorker& w) { return w.w().bytes_pulled(); })
      .def_property_readonly("finished", &PyWorker::finished)
      // serverMode: update (the worker learns it only as "servers save their optimizer state",
      // which is set exactly in update mode): trellis.torch refuses it up front.
      .def_property_readonly("update_mode",
                             [](PyWorker& w) { return w.w().checkpoint_config().servers_save; })
      .def("declare_key", &PyWorker::DeclareKey, py::arg("key"), py::arg("num_elements"),
           py::arg("name") = "", py::arg("wire") = "")
      .def("finish_declarations", &PyWorker::FinishDeclarations)
      .def(
          "push_pull",
          [](py::object self, int64_t key, py::buffer grad, py::object out, int priority) {
            return self.cast<PyWorker&>().PushPull(self, key, std::move(grad), std::move(out),
                                                   priority);
          },
          py::arg("key"), py::arg("grad"), py::arg("out") = py::none(), py::arg("priority") = 0)
      .def(
          "broadcast",
          [](py::object self, int64_t key, py::buffer data, int root) {
            return self.cast<PyWorker&>().Broadcast(self, key, std::move(data), root);
          },
          py::arg("key"), py::arg("data"), py::arg("root") = 0)
      .def("barrier", &PyWorker::Barrier, py::arg("name"))
      .def(
          "report_progress",
          [](PyWorker& w, int64_t step, int64_t samples, double loss) {
            Check(w.w().ReportProgress(step, samples, loss));  // records only: keeps the GIL
          },
          py::arg("step"), py::arg("samples") = 0,
          py::arg("loss") = std::numeric_limits<double>::quiet_NaN())
      .def(
          "set_total_steps",
          [](PyWorker& w, int64_t total) { Check(w.w().SetTotalSteps(total)); },
          py::arg("total_steps"))
      .def_property_readonly("job_stopping", &PyWorker::JobStopping)
      .def_property_readonly("timeout_ms", &PyWorker::TimeoutMs)
      .def("report_checkpoint", &PyWorker::ReportCheckpoint, py::arg("step"), py::arg("path"),
           py::arg("on_exit") = false, py::arg("restored") = false, py::arg("exit_ready") = false)
      .def_property_readonly("incarnation", &PyWorker::Incarnation)
      .def("step_boundary", &PyWorker::StepBoundary, py::arg("step"))
      .def_property_readonly("world", &PyWorker::World)
      .def("rejoin_start", &PyWorker::RejoinStart, py::arg("params"), py::arg("state_key"),
           py::arg("state"), py::arg("prepare") = py::none())
      .def("rejoin_commit", &PyWorker::RejoinCommit, py::arg("step"), py::arg("again") = false,
           py::arg("copy") = false)
      .def("rejoin_begin_update", &PyWorker::RejoinBeginUpdate)
      .def("rejoin_fetch", &PyWorker::RejoinFetch)
      .def_property_readonly("elastic", &PyWorker::Elastic)
      .def_property_readonly("slots", &PyWorker::Slots)
      .def_property_readonly("joined_from", &PyWorker::JoinedFrom)
      .def("rejoin_mark_servers", &PyWorker::RejoinMarkServers)
      .def("rejoin_stop", &PyWorker::RejoinStop)
      .def("close", &PyWorker::Close);
}
