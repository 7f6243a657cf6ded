/* Times a forward and its backward compiled with keep-host=1 (build.sh) as
 * a C caller sees them: wall-clock time of each call, which allocates its
 * results and workspace, copies its source tables, launches, waits for its
 * stream and frees what it allocated. Prints each against the byte floor
 * of the op (the bytes it must read and write), at the bandwidth a
 * device-to-device copy reaches in the same run. Usage: PROGRAM TOKENS
 * [ITERATIONS]. */

#define _POSIX_C_SOURCE 199309L

#include "attnres-c/GpuWrappers.h"
#include "host-program.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { L = SOURCES, D = WIDTH };

typedef struct {
  Desc2 o;
  Desc1 lse;
} Forward;
typedef struct {
  Desc3 dv;
  Desc1 dq, dg;
} Backward;

void _mlir_ciface_forward(Forward *, Desc3 *, Desc1 *, Desc1 *);
void _mlir_ciface_backward(Backward *, Desc3 *, Desc1 *, Desc1 *, Desc2 *,
                           Desc1 *, Desc2 *);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void *device(size_t bytes, uint16_t fill) {
  void *p = mgpuMemAlloc(bytes, NULL, false);
  mgpuMemset16(p, fill, bytes / 2, NULL);
  return p;
}

int main(int argc, char **argv) {
  if (argc < 2)
    return fprintf(stderr, "usage: %s TOKENS [ITERATIONS]\n", argv[0]), 2;
  int64_t N = atoll(argv[1]);
  int iterations = argc > 2 ? atoi(argv[2]) : 20;
  size_t rows = (size_t)N * D * 2;
  /* bf16 1.0 rows (uniform softmax), small query, unit key norm. */
  void *v = device(rows * L, 0x3f80), *q = device(2 * D, 0x3c00);
  void *g = device(2 * D, 0x3f80), *grad = device(rows, 0x3f80);
  if (attnresGpuLastError())
    return fprintf(stderr, "allocation failed: %s\n", attnresGpuLastError()),
           1;
  Desc3 vd = {v, v, 0, {L, N, D}, {N * D, D, 1}};
  Desc1 qd = {q, q, 0, {D}, {1}}, gd = {g, g, 0, {D}, {1}};
  Desc2 gradd = {grad, grad, 0, {N, D}, {D, 1}};

  /* The copy's bandwidth: read and write of the sources' bytes. */
  void *copy = mgpuMemAlloc(rows * L, NULL, false);
  mgpuMemcpy(copy, v, rows * L, NULL);
  mgpuStreamSynchronize(NULL);
  double start = now();
  for (int i = 0; i < iterations; ++i)
    mgpuMemcpy(copy, v, rows * L, NULL);
  mgpuStreamSynchronize(NULL);
  double bandwidth = 2.0 * rows * L * iterations / (now() - start);
  mgpuMemFree(copy, NULL);

  double forwardTime = 0, backwardTime = 0;
  for (int i = -3; i < iterations; ++i) {
    Forward f;
    Backward b;
    double t0 = now();
    _mlir_ciface_forward(&f, &vd, &qd, &gd);
    double t1 = now();
    _mlir_ciface_backward(&b, &vd, &qd, &gd, &gradd, &f.lse, &f.o);
    double t2 = now();
    if (attnresGpuLastError())
      return fprintf(stderr, "call failed: %s\n", attnresGpuLastError()), 1;
    if (i >= 0) {
      forwardTime += t1 - t0;
      backwardTime += t2 - t1;
    }
    mgpuMemFree(f.o.allocated, NULL);
    mgpuMemFree(f.lse.allocated, NULL);
    mgpuMemFree(b.dv.allocated, NULL);
    mgpuMemFree(b.dq.allocated, NULL);
    mgpuMemFree(b.dg.allocated, NULL);
  }
  forwardTime /= iterations;
  backwardTime /= iterations;
  /* The floors: the forward reads the sources and writes o and lse; the
   * backward reads the sources, do, o and lse and writes the source
   * gradients. */
  double forwardBytes = (double)rows * L + rows + 4.0 * N;
  double backwardBytes = 2.0 * rows * L + 2.0 * rows + 4.0 * N;
  printf("keep-host (L, N, D) = (%d, %lld, %d): copy %.0f GB/s\n", L,
         (long long)N, D, bandwidth / 1e9);
  printf("  forward  %8.1f us per call, %.2f of the byte floor\n",
         forwardTime * 1e6, forwardBytes / bandwidth / forwardTime);
  printf("  backward %8.1f us per call, %.2f of the byte floor\n",
         backwardTime * 1e6, backwardBytes / bandwidth / backwardTime);
  return 0;
}
