// The C API: translates between C types and trellis::Worker. No exception may cross into C,
// so every entry point that can allocate or call user code catches at the boundary.
#include "trellis/c_api.h"

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "trellis/trellis.h"
#include "worker-lib/src/c_api_internal.h"

struct trellis_worker {
  std::unique_ptr<trellis::Worker> impl;
};

struct trellis_handle {
  trellis::Handle impl;
};

namespace {

thread_local std::string last_error;  // this thread's message for trellis_last_error()

int Fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

int Report(const trellis::Status& status) {
  if (status.ok()) return TRELLIS_OK;
  return Fail(static_cast<int>(status.code()), status.message());
}

// Runs `fn` (returning an int code), turning any escaping exception into an error code.
template <typename Fn>
int Guard(const char* what, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(TRELLIS_RESOURCE_EXHAUSTED, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return Fail(TRELLIS_INTERNAL, std::string(what) + ": " + e.what());
  } catch (...) {
    return Fail(TRELLIS_INTERNAL, std::string(what) + ": unknown exception");
  }
}

int NullArgument(const char* what, const char* arg) {
  return Fail(TRELLIS_INVALID_ARGUMENT, std::string(what) + ": " + arg + " is NULL");
}

trellis::Callback WrapCallback(trellis_callback_t done, void* user_data) {
  if (done == nullptr) return nullptr;
  return [done, user_data](const trellis::Status& s) { done(static_cast<int>(s.code()), user_data); };
}

// Wraps a started operation's handle for C; the operation runs on even if this fails.
int ReturnHandle(const char* what, trellis::Handle handle, trellis_handle_t** out_handle) {
  *out_handle = new (std::nothrow) trellis_handle{std::move(handle)};
  if (*out_handle == nullptr) return Fail(TRELLIS_RESOURCE_EXHAUSTED, std::string(what) + ": out of memory");
  return TRELLIS_OK;
}

}  // namespace

namespace trellis {

trellis_worker_t* WrapWorkerForC(std::unique_ptr<Worker> worker) {
  if (worker == nullptr) return nullptr;
  return new trellis_worker{std::move(worker)};
}

}  // namespace trellis

extern "C" {

int trellis_c_api_version(void) { return TRELLIS_C_API_VERSION; }

const char* trellis_last_error(void) { return last_error.c_str(); }

void trellis_worker_options_init(trellis_worker_options_t* options) {
  if (options == nullptr) return;
  *options = trellis_worker_options_t{};
  options->struct_size = sizeof(trellis_worker_options_t);
  options->rank = -1;
}

int trellis_worker_create(const trellis_worker_options_t* options, trellis_worker_t** out) {
  constexpr const char* kWhat = "trellis_worker_create";
  if (out == nullptr) return NullArgument(kWhat, "out");
  *out = nullptr;
  trellis::WorkerOptions opts;
  if (options != nullptr) {
    // Older callers pass a smaller struct; fields beyond it keep their defaults.
    if (options->struct_size < offsetof(trellis_worker_options_t, timeout_ms) + sizeof(int64_t)) {
      return Fail(TRELLIS_INVALID_ARGUMENT,
                  std::string(kWhat) + ": options->struct_size is " +
                      std::to_string(options->struct_size) +
                      "; initialize options with trellis_worker_options_init()");
    }
    if (options->scheduler_address != nullptr) opts.scheduler_address = options->scheduler_address;
    if (options->token_file != nullptr) opts.token_file = options->token_file;
    opts.rank = options->rank;
    opts.slice_bytes = options->slice_bytes;
    opts.water_mark = options->water_mark;
    opts.timeout_ms = options->timeout_ms;
  }
  return Guard(kWhat, [&] {
    auto worker = trellis::Worker::Create(opts);
    if (!worker.ok()) return Report(worker.status());
    *out = new trellis_worker{std::move(worker).value()};
    return static_cast<int>(TRELLIS_OK);
  });
}

void trellis_worker_destroy(trellis_worker_t* worker) {
  // The worker's destructor leaves the job; it does not throw (library rule).
  delete worker;
}

int trellis_worker_rank(const trellis_worker_t* worker) {
  if (worker == nullptr) return (NullArgument("trellis_worker_rank", "worker"), -1);
  return worker->impl->rank();
}

int trellis_worker_size(const trellis_worker_t* worker) {
  if (worker == nullptr) return (NullArgument("trellis_worker_size", "worker"), -1);
  return worker->impl->size();
}

int trellis_worker_num_servers(const trellis_worker_t* worker) {
  if (worker == nullptr) return (NullArgument("trellis_worker_num_servers", "worker"), -1);
  return worker->impl->num_servers();
}

int trellis_declare_key(trellis_worker_t* worker, uint64_t key, const char* name,
                        int64_t num_elements) {
  constexpr const char* kWhat = "trellis_declare_key";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  return Guard(kWhat, [&] {
    trellis::KeyDecl decl;
    decl.id = key;
    if (name != nullptr) decl.name = name;
    decl.num_elements = num_elements;
    return Report(worker->impl->DeclareKey(decl));
  });
}

int trellis_finish_declarations(trellis_worker_t* worker) {
  constexpr const char* kWhat = "trellis_finish_declarations";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  return Guard(kWhat, [&] { return Report(worker->impl->FinishDeclarations()); });
}

int trellis_push_pull(trellis_worker_t* worker, uint64_t key, const float* grad, float* out,
                      int priority, trellis_callback_t done, void* user_data,
                      trellis_handle_t** out_handle) {
  constexpr const char* kWhat = "trellis_push_pull";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  if (grad == nullptr) return NullArgument(kWhat, "grad");
  if (out == nullptr) return NullArgument(kWhat, "out");
  if (out_handle == nullptr) return NullArgument(kWhat, "out_handle");
  *out_handle = nullptr;
  return Guard(kWhat, [&] {
    return ReturnHandle(kWhat,
                        worker->impl->PushPull(key, grad, out, priority, WrapCallback(done, user_data)),
                        out_handle);
  });
}

int trellis_push(trellis_worker_t* worker, uint64_t key, const float* grad, int priority,
                 trellis_callback_t done, void* user_data, trellis_handle_t** out_handle) {
  constexpr const char* kWhat = "trellis_push";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  if (grad == nullptr) return NullArgument(kWhat, "grad");
  if (out_handle == nullptr) return NullArgument(kWhat, "out_handle");
  *out_handle = nullptr;
  return Guard(kWhat, [&] {
    return ReturnHandle(kWhat, worker->impl->Push(key, grad, priority, WrapCallback(done, user_data)),
                        out_handle);
  });
}

int trellis_pull(trellis_worker_t* worker, uint64_t key, float* out, int priority,
                 trellis_callback_t done, void* user_data, trellis_handle_t** out_handle) {
  constexpr const char* kWhat = "trellis_pull";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  if (out == nullptr) return NullArgument(kWhat, "out");
  if (out_handle == nullptr) return NullArgument(kWhat, "out_handle");
  *out_handle = nullptr;
  return Guard(kWhat, [&] {
    return ReturnHandle(kWhat, worker->impl->Pull(key, out, priority, WrapCallback(done, user_data)),
                        out_handle);
  });
}

int trellis_broadcast(trellis_worker_t* worker, uint64_t key, float* data, int root,
                      trellis_handle_t** out_handle) {
  constexpr const char* kWhat = "trellis_broadcast";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  if (data == nullptr) return NullArgument(kWhat, "data");
  if (out_handle == nullptr) return NullArgument(kWhat, "out_handle");
  *out_handle = nullptr;
  return Guard(kWhat, [&] {
    return ReturnHandle(kWhat, worker->impl->Broadcast(key, data, root), out_handle);
  });
}

int trellis_handle_wait(trellis_handle_t* handle) {
  if (handle == nullptr) return NullArgument("trellis_handle_wait", "handle");
  return Guard("trellis_handle_wait", [&] { return Report(handle->impl.Wait()); });
}

int trellis_handle_done(const trellis_handle_t* handle) {
  if (handle == nullptr) return (NullArgument("trellis_handle_done", "handle"), -1);
  return handle->impl.Done() ? 1 : 0;
}

void trellis_handle_free(trellis_handle_t* handle) { delete handle; }

int trellis_barrier(trellis_worker_t* worker, const char* name) {
  constexpr const char* kWhat = "trellis_barrier";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  if (name == nullptr) return NullArgument(kWhat, "name");
  return Guard(kWhat, [&] { return Report(worker->impl->Barrier(name)); });
}

int trellis_report_progress(trellis_worker_t* worker, int64_t step, int64_t samples, double loss) {
  constexpr const char* kWhat = "trellis_report_progress";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  return Guard(kWhat, [&] { return Report(worker->impl->ReportProgress(step, samples, loss)); });
}

int trellis_set_total_steps(trellis_worker_t* worker, int64_t total_steps) {
  constexpr const char* kWhat = "trellis_set_total_steps";
  if (worker == nullptr) return NullArgument(kWhat, "worker");
  return Guard(kWhat, [&] { return Report(worker->impl->SetTotalSteps(total_steps)); });
}

uint64_t trellis_bytes_pushed(const trellis_worker_t* worker) {
  return worker == nullptr ? 0 : worker->impl->bytes_pushed();
}

uint64_t trellis_bytes_pulled(const trellis_worker_t* worker) {
  return worker == nullptr ? 0 : worker->impl->bytes_pulled();
}

}  // extern "C"
