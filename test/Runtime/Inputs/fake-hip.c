/* A stand-in for HIP's runtime library (libamdhip64.so), for testing the
 * HIP side of libAttnResRuntime's mgpu* functions where there is no AMD
 * GPU: device memory is host memory (256-byte aligned, as HIP's is),
 * copies and fills are memcpy and memset, kernels do not run. Each module
 * load, kernel lookup and launch is printed on stderr ("fake hip: ..."),
 * with what a real HIP would check: an image must be an AMD GPU code object
 * (ELF, EM_AMDGPU), a kernel must be named in the image, a launch needs a
 * kernel that was looked up. At exit it prints how many allocations, streams
 * and events are still live. Occupancy: 2 blocks of any kernel per compute
 * unit, 304 compute units (an MI300X's). */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  hipSuccess = 0,
  hipErrorInvalidValue = 1,
  hipErrorInvalidDevice = 101,
  hipErrorInvalidImage = 200,
  hipErrorNotFound = 500,
  hipDeviceAttributeMultiprocessorCount = 63,
  kComputeUnits = 304,
  kBlocksPerComputeUnit = 2,
};

static long liveAllocations, liveStreams, liveEvents, launches;

static void report(void) {
  fprintf(stderr,
          "fake hip: at exit %ld allocations, %ld streams, %ld events live; "
          "%ld launches\n",
          liveAllocations, liveStreams, liveEvents, launches);
}

int hipInit(unsigned flags) {
  (void)flags;
  atexit(report);
  return hipSuccess;
}
int hipGetDeviceCount(int *count) {
  *count = 1;
  return hipSuccess;
}
int hipDeviceGet(int *device, int ordinal) {
  if (ordinal != 0)
    return hipErrorInvalidDevice;
  *device = 0;
  return hipSuccess;
}
int hipSetDevice(int device) {
  return device == 0 ? hipSuccess : hipErrorInvalidDevice;
}
int hipGetDevice(int *device) {
  *device = 0;
  return hipSuccess;
}
int hipDeviceGetAttribute(int *value, int attribute, int device) {
  (void)device;
  *value =
      attribute == hipDeviceAttributeMultiprocessorCount ? kComputeUnits : 0;
  return hipSuccess;
}
const char *hipGetErrorString(int error) {
  switch (error) {
  case hipErrorInvalidImage:
    return "fake: not an AMD GPU code object";
  case hipErrorNotFound:
    return "fake: no such kernel";
  default:
    return "fake: error";
  }
}

typedef struct {
  const unsigned char *image;
  size_t size;
} Module;
typedef struct {
  char name[256];
} Function;

int hipModuleLoadData(void **module, const void *image) {
  const unsigned char *bytes = image;
  uint16_t machine = 0;
  if (memcmp(bytes, "\177ELF", 4) != 0 || bytes[4] != 2 /* ELFCLASS64 */)
    return hipErrorInvalidImage;
  memcpy(&machine, bytes + 18, 2);
  if (machine != 224 /* EM_AMDGPU */)
    return hipErrorInvalidImage;
  /* The image ends with its section headers: e_shoff + e_shnum *
   * e_shentsize. */
  uint64_t headers = 0;
  uint16_t entrySize = 0, entries = 0;
  memcpy(&headers, bytes + 0x28, 8);
  memcpy(&entrySize, bytes + 0x3A, 2);
  memcpy(&entries, bytes + 0x3C, 2);
  Module *m = malloc(sizeof(Module));
  m->image = bytes;
  m->size = headers + (size_t)entries * entrySize;
  fprintf(stderr, "fake hip: hipModuleLoadData: an AMD GPU code object\n");
  *module = m;
  return hipSuccess;
}
int hipModuleUnload(void *module) {
  free(module);
  return hipSuccess;
}
int hipModuleGetFunction(void **function, void *module, const char *name) {
  const Module *m = module;
  size_t length = strlen(name) + 1; /* a symbol name ends with its NUL */
  for (size_t i = 0; i + length <= m->size; ++i)
    if (memcmp(m->image + i, name, length) == 0 &&
        (i == 0 || m->image[i - 1] == 0) && length <= sizeof(Function)) {
      Function *f = malloc(sizeof(Function));
      memcpy(f->name, name, length);
      fprintf(stderr, "fake hip: hipModuleGetFunction %s\n", name);
      *function = f;
      return hipSuccess;
    }
  return hipErrorNotFound;
}
int hipModuleLaunchKernel(void *function, unsigned gridX, unsigned gridY,
                          unsigned gridZ, unsigned blockX, unsigned blockY,
                          unsigned blockZ, unsigned sharedBytes, void *stream,
                          void **params, void **extra) {
  (void)stream;
  (void)extra;
  if (!function || !params)
    return hipErrorInvalidValue;
  ++launches;
  fprintf(stderr,
          "fake hip: hipModuleLaunchKernel %s grid %u x %u x %u block "
          "%u x %u x %u shared %u\n",
          ((Function *)function)->name, gridX, gridY, gridZ, blockX, blockY,
          blockZ, sharedBytes);
  return hipSuccess;
}
int hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks,
                                                       void *function,
                                                       int blockThreads,
                                                       size_t sharedBytes) {
  (void)sharedBytes;
  if (!function || blockThreads < 1)
    return hipErrorInvalidValue;
  *blocks = kBlocksPerComputeUnit;
  return hipSuccess;
}

static int allocate(void **pointer, size_t bytes) {
  *pointer = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!*pointer)
    return 2; /* hipErrorOutOfMemory */
  ++liveAllocations;
  return hipSuccess;
}
int hipMalloc(void **pointer, size_t bytes) { return allocate(pointer, bytes); }
int hipMallocManaged(void **pointer, size_t bytes, unsigned flags) {
  (void)flags;
  return allocate(pointer, bytes);
}
int hipFree(void *pointer) {
  if (pointer) {
    free(pointer);
    --liveAllocations;
  }
  return hipSuccess;
}
int hipMemcpyAsync(void *to, const void *from, size_t bytes, int kind,
                   void *stream) {
  (void)stream;
  if (kind != 4 /* hipMemcpyDefault */)
    return hipErrorInvalidValue;
  memcpy(to, from, bytes);
  return hipSuccess;
}
int hipMemsetD32Async(void *to, int value, size_t count, void *stream) {
  (void)stream;
  for (size_t i = 0; i < count; ++i)
    memcpy((char *)to + 4 * i, &value, 4);
  return hipSuccess;
}
int hipMemsetD16Async(void *to, unsigned short value, size_t count,
                      void *stream) {
  (void)stream;
  for (size_t i = 0; i < count; ++i)
    memcpy((char *)to + 2 * i, &value, 2);
  return hipSuccess;
}
int hipHostRegister(void *pointer, size_t bytes, unsigned flags) {
  (void)pointer;
  (void)bytes;
  (void)flags;
  return hipSuccess;
}
int hipHostUnregister(void *pointer) {
  (void)pointer;
  return hipSuccess;
}

/* Streams and events are counted handles. */
static int createHandle(void **handle, long *live) {
  *handle = malloc(1);
  ++*live;
  return hipSuccess;
}
static int destroyHandle(void *handle, long *live) {
  free(handle);
  --*live;
  return hipSuccess;
}

int hipStreamCreateWithFlags(void **stream, unsigned flags) {
  (void)flags;
  return createHandle(stream, &liveStreams);
}
int hipStreamDestroy(void *stream) {
  return destroyHandle(stream, &liveStreams);
}
int hipStreamSynchronize(void *stream) {
  (void)stream;
  return hipSuccess;
}
int hipStreamWaitEvent(void *stream, void *event, unsigned flags) {
  (void)stream;
  (void)flags;
  return event ? hipSuccess : hipErrorInvalidValue;
}
int hipEventCreateWithFlags(void **event, unsigned flags) {
  (void)flags;
  return createHandle(event, &liveEvents);
}
int hipEventDestroy(void *event) { return destroyHandle(event, &liveEvents); }
int hipEventSynchronize(void *event) {
  return event ? hipSuccess : hipErrorInvalidValue;
}
int hipEventRecord(void *event, void *stream) {
  (void)stream;
  return event ? hipSuccess : hipErrorInvalidValue;
}
