/* A worker written in plain C99 against trellis/c_api.h, run by trellis-launch in the
 * c_api_launch test: joins, declares a key, broadcasts, sums, checks, barriers. Exit 0 = all
 * checks passed; messages go to stderr with the rank. */
#include <stdio.h>
#include <stdlib.h>

#include "trellis/c_api.h"

#define N 1000

static int check(int code, const char* what, int rank) {
  if (code != TRELLIS_OK) {
    fprintf(stderr, "c-smoke rank %d: %s failed: code %d: %s\n", rank, what, code,
            trellis_last_error());
  }
  return code == TRELLIS_OK;
}

int main(void) {
  trellis_worker_t* w = NULL;
  trellis_handle_t* h = NULL;
  static float data[N], grad[N];
  int rank, size, i, step;

  if (!check(trellis_worker_create(NULL, &w), "trellis_worker_create", -1)) return 3;
  rank = trellis_worker_rank(w);
  size = trellis_worker_size(w);
  if (!check(trellis_declare_key(w, 0, "vec", N), "declare_key", rank)) return 1;
  if (!check(trellis_finish_declarations(w), "finish_declarations", rank)) return 1;

  for (i = 0; i < N; ++i) data[i] = (float)(rank * 100000 + i);
  if (!check(trellis_broadcast(w, 0, data, 0, &h), "broadcast", rank)) return 1;
  if (!check(trellis_handle_wait(h), "broadcast wait", rank)) return 1;
  trellis_handle_free(h);
  for (i = 0; i < N; ++i) {
    if (data[i] != (float)i) {
      fprintf(stderr, "c-smoke rank %d: broadcast element %d is %f, want %d\n", rank, i, data[i], i);
      return 1;
    }
  }

  for (step = 0; step < 3; ++step) {
    for (i = 0; i < N; ++i) grad[i] = (float)(rank + 1 + step);
    if (!check(trellis_push_pull(w, 0, grad, grad, 0, NULL, NULL, &h), "push_pull", rank)) return 1;
    if (!check(trellis_handle_wait(h), "push_pull wait", rank)) return 1;
    trellis_handle_free(h);
    for (i = 0; i < N; ++i) {
      /* sum over ranks r of (r + 1 + step) */
      float want = (float)(size * (size + 1) / 2 + size * step);
      if (grad[i] != want) {
        fprintf(stderr, "c-smoke rank %d: step %d element %d is %f, want %f\n", rank, step, i,
                grad[i], want);
        return 1;
      }
    }
  }
  if (!check(trellis_barrier(w, "c-smoke-done"), "barrier", rank)) return 1;
  printf("c-smoke rank %d of %d: OK, pushed %llu bytes\n", rank, size,
         (unsigned long long)trellis_bytes_pushed(w));
  trellis_worker_destroy(w);
  return 0;
}
