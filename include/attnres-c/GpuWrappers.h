/*===- attnres-c/GpuWrappers.h - MLIR's GPU host entry points ----*- C -*-===*\
|*                                                                            *|
|* MLIR lowers host-side GPU operations (gpu.launch_func, gpu.alloc,          *|
|* gpu.memcpy, gpu.memset, gpu.wait, gpu.host_register,                       *|
|* gpu.set_default_device) and loads the kernels of a gpu.binary through      *|
|* calls of C functions named mgpu*. Upstream implements them in              *|
|* libmlir_cuda_runtime, which Debian's LLVM packages do not ship;            *|
|* libAttnResRuntime implements them over the CUDA driver it opens at run     *|
|* time, so a host object that upstream MLIR produced links against           *|
|* libAttnResRuntime alone and runs where there is no MLIR                    *|
|* (docs/Embedding.md, "Host code lowered by MLIR").                          *|
|*                                                                            *|
|* They return nothing or a handle, as the generated code expects. A         *|
|* failure (no driver, a driver error, a null handle, a bad argument) is      *|
|* printed to stderr with the function's name, kept for                       *|
|* attnresGpuLastError() on the calling thread, and gives a null handle;      *|
|* nothing aborts. The calls run in the primary context of the thread's       *|
|* default device (device 0 unless mgpuSetDefaultDevice chose another).       *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef ATTNRES_C_GPUWRAPPERS_H
#define ATTNRES_C_GPUWRAPPERS_H

#include "attnres-c/Runtime.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The message of the last mgpu* call that failed on this thread (valid until
 * the next failure or attnresGpuClearError on this thread), or NULL. */
ATTNRES_RUNTIME_EXPORT const char *attnresGpuLastError(void);
ATTNRES_RUNTIME_EXPORT void attnresGpuClearError(void);

/* Kernel images: a cubin or fatbin (mgpuModuleLoad; `size` is the image's
 * length) or PTX compiled by the driver (mgpuModuleLoadJIT). */
ATTNRES_RUNTIME_EXPORT void *mgpuModuleLoad(void *data, size_t size);
ATTNRES_RUNTIME_EXPORT void *mgpuModuleLoadJIT(void *data, int optLevel);
ATTNRES_RUNTIME_EXPORT void mgpuModuleUnload(void *module);
ATTNRES_RUNTIME_EXPORT void *mgpuModuleGetFunction(void *module,
                                                   const char *name);

/* Launches. `params` points to one pointer per kernel argument. */
ATTNRES_RUNTIME_EXPORT void
mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY, intptr_t gridZ,
                 intptr_t blockX, intptr_t blockY, intptr_t blockZ,
                 int32_t sharedMemBytes, void *stream, void **params,
                 void **extra, size_t paramsCount);
ATTNRES_RUNTIME_EXPORT void
mgpuLaunchClusterKernel(void *function, intptr_t clusterX, intptr_t clusterY,
                        intptr_t clusterZ, intptr_t gridX, intptr_t gridY,
                        intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                        intptr_t blockZ, int32_t sharedMemBytes, void *stream,
                        void **params, void **extra);

/* Streams (non-blocking with respect to the legacy default stream) and
 * events (without timing). */
ATTNRES_RUNTIME_EXPORT void *mgpuStreamCreate(void);
ATTNRES_RUNTIME_EXPORT void mgpuStreamDestroy(void *stream);
ATTNRES_RUNTIME_EXPORT void mgpuStreamSynchronize(void *stream);
ATTNRES_RUNTIME_EXPORT void mgpuStreamWaitEvent(void *stream, void *event);
ATTNRES_RUNTIME_EXPORT void *mgpuEventCreate(void);
ATTNRES_RUNTIME_EXPORT void mgpuEventDestroy(void *event);
ATTNRES_RUNTIME_EXPORT void mgpuEventSynchronize(void *event);
ATTNRES_RUNTIME_EXPORT void mgpuEventRecord(void *event, void *stream);

/* Memory. `hostShared` allocates managed memory the host can also touch; a
 * size of 0 gives NULL without an error. Copies and fills are ordered on
 * `stream`; host pointers may be pageable. */
ATTNRES_RUNTIME_EXPORT void *mgpuMemAlloc(uint64_t sizeBytes, void *stream,
                                          bool hostShared);
ATTNRES_RUNTIME_EXPORT void mgpuMemFree(void *pointer, void *stream);
ATTNRES_RUNTIME_EXPORT void mgpuMemcpy(void *destination, void *source,
                                       size_t sizeBytes, void *stream);
ATTNRES_RUNTIME_EXPORT void mgpuMemset32(void *destination, uint32_t value,
                                         size_t count, void *stream);
ATTNRES_RUNTIME_EXPORT void mgpuMemset16(void *destination, uint16_t value,
                                         size_t count, void *stream);

/* Page-locks host memory: a byte range, or the dense memref whose ranked
 * descriptor (allocated pointer, aligned pointer, offset, sizes, strides)
 * `descriptor` points to. */
ATTNRES_RUNTIME_EXPORT void mgpuMemHostRegister(void *pointer,
                                                uint64_t sizeBytes);
ATTNRES_RUNTIME_EXPORT void mgpuMemHostUnregister(void *pointer);
ATTNRES_RUNTIME_EXPORT void
mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor, int64_t elementBytes);
ATTNRES_RUNTIME_EXPORT void mgpuMemHostUnregisterMemRef(int64_t rank,
                                                        void *descriptor,
                                                        int64_t elementBytes);

/* The device later calls on this thread use (a CUDA device ordinal). */
ATTNRES_RUNTIME_EXPORT void mgpuSetDefaultDevice(int32_t device);

#ifdef __cplusplus
}
#endif

#endif /* ATTNRES_C_GPUWRAPPERS_H */
