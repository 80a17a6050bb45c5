/* Trellis worker library: the stable C API (a thin layer over trellis::Worker in trellis.h).
 *
 *   trellis_worker_t* w = NULL;
 *   if (trellis_worker_create(NULL, &w) != TRELLIS_OK) {
 *     fprintf(stderr, "%s\n", trellis_last_error());
 *     return 1;
 *   }
 *   trellis_declare_key(w, 0, "fc1", n);
 *   trellis_finish_declarations(w);                 // collective: all workers, same keys
 *   trellis_handle_t* h = NULL;
 *   trellis_broadcast(w, 0, params, 0, &h);          // everyone starts from rank 0's values
 *   trellis_handle_wait(h); trellis_handle_free(h);
 *   for each step:
 *     trellis_push_pull(w, 0, grad, sum, -0, NULL, NULL, &h);   // async
 *     ... trellis_handle_wait(h); trellis_handle_free(h);
 *   trellis_worker_destroy(w);
 *
 * Conventions:
 *  - Every fallible function returns an int: TRELLIS_OK (0) or a trellis_status_code (the same
 *    numbers as trellis::StatusCode and gRPC). The message of the calling thread's last error is
 *    trellis_last_error() (thread-local; valid until that thread's next failing call).
 *  - Objects are opaque; the caller owns what a create/start function returns and frees it with
 *    the matching destroy/free function. Freeing a handle does not cancel the operation; the
 *    buffers passed to it must stay valid until it is done (wait first).
 *  - Nothing here aborts the process on bad input: NULL pointers and unknown keys return
 *    TRELLIS_INVALID_ARGUMENT (or the library's error code) with a message.
 *  - ABI: structs passed in carry their own size (struct_size) so fields can be added later.
 */
#ifndef TRELLIS_C_API_H_
#define TRELLIS_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRELLIS_C_API_VERSION 2 /* 2: trellis_report_progress, trellis_set_total_steps */

typedef enum trellis_status_code {
  TRELLIS_OK = 0,
  TRELLIS_CANCELLED = 1,
  TRELLIS_UNKNOWN = 2,
  TRELLIS_INVALID_ARGUMENT = 3,
  TRELLIS_DEADLINE_EXCEEDED = 4,
  TRELLIS_NOT_FOUND = 5,
  TRELLIS_ALREADY_EXISTS = 6,
  TRELLIS_PERMISSION_DENIED = 7,
  TRELLIS_RESOURCE_EXHAUSTED = 8,
  TRELLIS_FAILED_PRECONDITION = 9,
  TRELLIS_ABORTED = 10,
  TRELLIS_OUT_OF_RANGE = 11,
  TRELLIS_UNIMPLEMENTED = 12,
  TRELLIS_INTERNAL = 13,
  TRELLIS_UNAVAILABLE = 14,
  TRELLIS_DATA_LOSS = 15,
  TRELLIS_UNAUTHENTICATED = 16
} trellis_status_code;

typedef struct trellis_worker trellis_worker_t;
typedef struct trellis_handle trellis_handle_t;

/* Called once when an operation completes, on a library thread: keep it short. `code` is the
 * operation's status code; `user_data` is what was passed with the operation. */
typedef void (*trellis_callback_t)(int code, void* user_data);

/* Overrides for what the environment and the job say; zero / NULL means "not set here".
 * Initialize with trellis_worker_options_init(). */
typedef struct trellis_worker_options {
  size_t struct_size;             /* sizeof(trellis_worker_options_t), set by _init */
  const char* scheduler_address;  /* else TRELLIS_SCHEDULER */
  const char* token_file;         /* else TRELLIS_TOKEN_FILE */
  int32_t rank;                   /* -1: TRELLIS_RANK */
  int64_t slice_bytes;            /* else the job's sliceBytes */
  int32_t water_mark;             /* else the job's priority.waterMark */
  int64_t timeout_ms;             /* per-operation deadline; else 120000 */
} trellis_worker_options_t;

/* The version of this API the library implements (TRELLIS_C_API_VERSION it was built with). */
int trellis_c_api_version(void);

/* The calling thread's last error message ("" when none). Never NULL. */
const char* trellis_last_error(void);

void trellis_worker_options_init(trellis_worker_options_t* options);

/* Joins the job. `options` may be NULL (environment only). On success *out is the worker. */
int trellis_worker_create(const trellis_worker_options_t* options, trellis_worker_t** out);
/* Leaves the job and frees the worker. NULL is a no-op. */
void trellis_worker_destroy(trellis_worker_t* worker);

/* -1 (and a last error) when worker is NULL. */
int trellis_worker_rank(const trellis_worker_t* worker);
int trellis_worker_size(const trellis_worker_t* worker);
int trellis_worker_num_servers(const trellis_worker_t* worker);

/* Declares a float32 key of `num_elements` (>= 1). `name` may be NULL. */
int trellis_declare_key(trellis_worker_t* worker, uint64_t key, const char* name,
                        int64_t num_elements);
/* Collective: all workers must declare the same keys. */
int trellis_finish_declarations(trellis_worker_t* worker);

/* Asynchronous operations: on TRELLIS_OK, *out_handle is a new handle (free it). `done` may be
 * NULL. `grad` may equal `out`; both must stay valid until the handle is done. */
int trellis_push_pull(trellis_worker_t* worker, uint64_t key, const float* grad, float* out,
                      int priority, trellis_callback_t done, void* user_data,
                      trellis_handle_t** out_handle);
int trellis_push(trellis_worker_t* worker, uint64_t key, const float* grad, int priority,
                 trellis_callback_t done, void* user_data, trellis_handle_t** out_handle);
int trellis_pull(trellis_worker_t* worker, uint64_t key, float* out, int priority,
                 trellis_callback_t done, void* user_data, trellis_handle_t** out_handle);
int trellis_broadcast(trellis_worker_t* worker, uint64_t key, float* data, int root,
                      trellis_handle_t** out_handle);

/* Blocks until done; returns the operation's status code. */
int trellis_handle_wait(trellis_handle_t* handle);
/* 1 when done, 0 when not (never blocks); -1 when handle is NULL. */
int trellis_handle_done(const trellis_handle_t* handle);
/* Frees the handle object (not the operation). NULL is a no-op. */
void trellis_handle_free(trellis_handle_t* handle);

/* Blocks until every worker reached the barrier of this name. */
int trellis_barrier(trellis_worker_t* worker, const char* name);

/* Training progress (since API version 2; docs/user-guide.md#progress): call once per step,
 * after it. samples: this worker's samples in the step (0: not known); loss: NAN for none.
 * Cheap: the library sends what it recorded to the scheduler about once a second. */
int trellis_report_progress(trellis_worker_t* worker, int64_t step, int64_t samples, double loss);
/* The number of steps the job will run (> 0), for the ETA. */
int trellis_set_total_steps(trellis_worker_t* worker, int64_t total_steps);

/* Payload bytes this worker sent / received on the data path; 0 when worker is NULL. */
uint64_t trellis_bytes_pushed(const trellis_worker_t* worker);
uint64_t trellis_bytes_pulled(const trellis_worker_t* worker);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TRELLIS_C_API_H_ */
