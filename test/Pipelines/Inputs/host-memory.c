/* The GPU entry points host-layer-main.c calls, over host memory: the
 * same program then checks the CPU reference pipeline's code, whose results
 * are host buffers. */

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void *mgpuMemAlloc(uint64_t sizeBytes, void *stream, bool hostShared) {
  (void)stream;
  (void)hostShared;
  return malloc(sizeBytes);
}
void mgpuMemcpy(void *destination, void *source, size_t sizeBytes,
                void *stream) {
  (void)stream;
  memcpy(destination, source, sizeBytes);
}
void mgpuMemFree(void *pointer, void *stream) {
  (void)stream;
  free(pointer);
}
void mgpuStreamSynchronize(void *stream) { (void)stream; }
const char *attnresGpuLastError(void) { return NULL; }
