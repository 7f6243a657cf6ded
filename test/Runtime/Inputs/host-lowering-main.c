/* Calls the host functions of host-lowering.mlir, lowered by upstream MLIR
 * and linked against libAttnResRuntime, and the mgpu* functions directly;
 * checks every result on the host. Prints "host lowering: ok" and exits 0
 * when all hold; where a GPU call fails, prints the runtime's message and
 * exits 1. */

#include "attnres-c/GpuWrappers.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* The lowered functions: a memref<?xf32> argument is passed as its
 * descriptor's fields (allocated and aligned pointers, offset, size,
 * stride). */
void add_fill(float *, float *, int64_t, int64_t, int64_t, float *, float *,
              int64_t, int64_t, int64_t, int64_t n, float fill);
void add_clustered(float *, float *, int64_t, int64_t, int64_t, float *,
                   float *, int64_t, int64_t, int64_t, float *, float *,
                   int64_t, int64_t, int64_t, int64_t n);

enum { N = 1000 };

static int failed(const char *what) {
  const char *message = attnresGpuLastError();
  printf("host lowering: %s failed: %s\n", what,
         message ? message : "(no message)");
  return 1;
}

static int wrong(const char *what, int64_t i, double got, double expected) {
  printf("host lowering: %s: element %lld is %g, expected %g\n", what,
         (long long)i, got, expected);
  return 1;
}

int main(void) {
  static float x[N], y[N];
  for (int64_t i = 0; i < N; ++i) {
    x[i] = (float)i;
    y[i] = (float)(2 * i);
  }
  /* 1. Allocation, copies, a 32-bit fill and a launch, from MLIR. */
  add_fill(x, x, 0, N, 1, y, y, 0, N, 1, N, 0.5f);
  if (attnresGpuLastError())
    return failed("add_fill");
  for (int64_t i = 0; i < N; ++i)
    if (y[i] != 3.0f * i + 0.5f)
      return wrong("add_fill", i, y[i], 3.0 * i + 0.5);

  /* 2. A clustered launch, from MLIR, on managed memory. */
  float *mx = mgpuMemAlloc(N * sizeof(float), NULL, true);
  float *my = mgpuMemAlloc(N * sizeof(float), NULL, true);
  float *mc = mgpuMemAlloc(N * sizeof(float), NULL, true);
  if (!mx || !my || !mc)
    return failed("mgpuMemAlloc (managed)");
  for (int64_t i = 0; i < N; ++i) {
    mx[i] = 1.0f;
    my[i] = (float)i;
    mc[i] = 2.0f;
  }
  add_clustered(mx, mx, 0, N, 1, my, my, 0, N, 1, mc, mc, 0, N, 1, N);
  if (attnresGpuLastError())
    return failed("add_clustered");
  for (int64_t i = 0; i < N; ++i)
    if (my[i] != i + 3.0f)
      return wrong("add_clustered", i, my[i], i + 3.0);

  /* 3. Two streams ordered by an event: a 16-bit fill on one, the copy
   * back on the other. */
  void *first = mgpuStreamCreate(), *second = mgpuStreamCreate();
  void *filled = mgpuEventCreate();
  uint16_t *halves = mgpuMemAlloc(64 * sizeof(uint16_t), first, false);
  uint16_t back[64];
  memset(back, 0, sizeof(back));
  mgpuMemset16(halves, 0x3c00, 64, first); /* 1.0 in f16 */
  mgpuEventRecord(filled, first);
  mgpuStreamWaitEvent(second, filled);
  mgpuMemcpy(back, halves, sizeof(back), second);
  mgpuStreamSynchronize(second);
  mgpuEventSynchronize(filled);
  if (attnresGpuLastError())
    return failed("streams and events");
  for (int64_t i = 0; i < 64; ++i)
    if (back[i] != 0x3c00)
      return wrong("mgpuMemset16", i, back[i], 0x3c00);

  /* 4. Page-locking a memref's memory, through its descriptor. */
  struct {
    float *allocated, *aligned;
    int64_t offset, sizes[1], strides[1];
  } descriptor = {x, x, 0, {N}, {1}};
  mgpuMemHostRegisterMemRef(1, &descriptor, sizeof(float));
  mgpuMemHostUnregisterMemRef(1, &descriptor, sizeof(float));
  if (attnresGpuLastError())
    return failed("mgpuMemHostRegisterMemRef");

  /* 5. Misuse is reported, not a crash. */
  mgpuSetDefaultDevice(1 << 20);
  if (!attnresGpuLastError() ||
      !strstr(attnresGpuLastError(), "does not exist"))
    return failed("refusing a device that does not exist");
  attnresGpuClearError();
  mgpuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL, 0);
  if (!attnresGpuLastError() || !strstr(attnresGpuLastError(), "no kernel"))
    return failed("refusing a null kernel");
  attnresGpuClearError();
  /* A destroyed stream is kept for the next mgpuStreamCreate: destroying
   * it again is refused, and a new stream is a working one. */
  void *kept = mgpuStreamCreate();
  mgpuStreamDestroy(kept);
  mgpuStreamDestroy(kept);
  if (!attnresGpuLastError() ||
      !strstr(attnresGpuLastError(), "destroyed already"))
    return failed("refusing to destroy a stream twice");
  attnresGpuClearError();
  void *again = mgpuStreamCreate();
  mgpuStreamSynchronize(again);
  mgpuStreamDestroy(again);
  if (attnresGpuLastError())
    return failed("reusing a kept stream");

  mgpuEventDestroy(filled);
  mgpuMemFree(halves, first);
  mgpuStreamDestroy(first);
  mgpuStreamDestroy(second);
  mgpuMemFree(mx, NULL);
  mgpuMemFree(my, NULL);
  mgpuMemFree(mc, NULL);
  if (attnresGpuLastError())
    return failed("freeing");
  /* The memory freed above went back to the runtime's pool; it can be
   * given back to the driver. */
  attnresGpuReleaseCachedMemory();
  if (attnresGpuLastError())
    return failed("attnresGpuReleaseCachedMemory");
  printf("host lowering: ok\n");
  return 0;
}
