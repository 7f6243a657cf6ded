//===- EntryPoints.h - The driver functions the runtime calls ---*- C++ -*-===//
//
// The entry points of the CUDA driver or of HIP that the runtime library
// calls, bound once by name (EntryPoints.cpp) for both of its users: the
// bundle runtime (Runtime.cpp) and MLIR's mgpu* host functions
// (GpuWrappers.cpp). HIP's functions take the same arguments as the CUDA
// driver's except where noted. Private to the runtime library.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_ENTRYPOINTS_H
#define ATTNRES_RUNTIME_ENTRYPOINTS_H

#include "DriverApi.h"

#include <cstddef>
#include <string>

namespace attnres::driver {

using Result = int;

struct EntryPoints {
  bool hip = false;
  Result (*init)(unsigned) = nullptr;
  Result (*deviceGetCount)(int *) = nullptr;
  Result (*deviceGet)(int *, int) = nullptr;
  Result (*deviceGetAttribute)(int *, int, int) = nullptr;
  Result (*moduleLoadData)(void **, const void *) = nullptr;
  Result (*moduleUnload)(void *) = nullptr;
  Result (*moduleGetFunction)(void **, void *, const char *) = nullptr;
  Result (*launchKernel)(void *, unsigned, unsigned, unsigned, unsigned,
                         unsigned, unsigned, unsigned, void *, void **,
                         void **) = nullptr;
  // Blocks of a kernel a multiprocessor holds at once.
  Result (*occupancy)(int *, void *, int, size_t) = nullptr;
  Result (*streamCreate)(void **, unsigned) = nullptr;
  Result (*streamDestroy)(void *) = nullptr;
  Result (*streamSynchronize)(void *) = nullptr;
  Result (*streamWaitEvent)(void *, void *, unsigned) = nullptr;
  Result (*eventCreate)(void **, unsigned) = nullptr;
  Result (*eventDestroy)(void *) = nullptr;
  Result (*eventSynchronize)(void *) = nullptr;
  Result (*eventRecord)(void *, void *) = nullptr;
  Result (*memAlloc)(unsigned long long *, size_t) = nullptr;
  Result (*memAllocManaged)(unsigned long long *, size_t, unsigned) = nullptr;
  Result (*memFree)(unsigned long long) = nullptr;
  Result (*memsetD32Async)(unsigned long long, unsigned, size_t,
                           void *) = nullptr;
  Result (*memsetD16Async)(unsigned long long, unsigned short, size_t,
                           void *) = nullptr;
  Result (*memHostRegister)(void *, size_t, unsigned) = nullptr;
  Result (*memHostUnregister)(void *) = nullptr;

  // CUDA only: contexts (HIP has a current device per thread instead).
  Result (*primaryCtxRetain)(void **, int) = nullptr;
  Result (*ctxPushCurrent)(void *) = nullptr;
  Result (*ctxPopCurrent)(void **) = nullptr;
  Result (*ctxGetCurrent)(void **) = nullptr;
  Result (*ctxGetDevice)(int *) = nullptr;
  Result (*ctxSetCurrent)(void *) = nullptr;
  Result (*moduleLoadDataEx)(void **, const void *, unsigned, int *,
                             void **) = nullptr;
  Result (*memcpyAsync)(unsigned long long, unsigned long long, size_t,
                        void *) = nullptr;
  Result (*getErrorString)(Result, const char **) = nullptr; // optional
  // CUDA 12 and later, optional: launches with thread-block clusters, and
  // how many clusters of a launch the device holds at once.
  Result (*launchKernelEx)(const LaunchConfig *, void *, void **,
                           void **) = nullptr;
  Result (*occupancyMaxActiveClusters)(int *, void *,
                                       const LaunchConfig *) = nullptr;
  // CUDA 11.2 and later, optional (all null where one is missing):
  // stream-ordered allocation.
  Result (*ctxSynchronize)() = nullptr;
  Result (*memPoolCreate)(void **, const void *) = nullptr;
  Result (*memPoolSetAttribute)(void *, int, void *) = nullptr;
  Result (*memPoolTrimTo)(void *, size_t) = nullptr;
  Result (*memAllocFromPoolAsync)(unsigned long long *, size_t, void *,
                                  void *) = nullptr;
  Result (*memFreeAsync)(unsigned long long, void *) = nullptr;

  // HIP only.
  Result (*setDevice)(int) = nullptr;
  Result (*getDevice)(int *) = nullptr;
  // A copy takes its direction (hipMemcpyDefault: from the pointers).
  Result (*hipMemcpyAsync)(void *, const void *, size_t, int, void *) = nullptr;
  const char *(*hipErrorString)(Result) = nullptr; // optional

  const char *api() const { return hip ? "HIP" : "CUDA"; }
  /// "CUDA error 4: <text>".
  std::string describe(Result result) const;
};

/// Binds `vendor`'s entry points in its opened `library`. False where one
/// that is not optional is missing: a release older than `vendor.oldest`.
bool bindEntryPoints(void *library, const Vendor &vendor, EntryPoints &d);

/// "<the CUDA driver> (<libcuda.so.1>) lacks an entry point <who> needs
/// (CUDA 11 or later has them)": the message where bindEntryPoints failed.
std::string lacksEntryPoint(const Vendor &vendor, const char *who);

} // namespace attnres::driver

#endif // ATTNRES_RUNTIME_ENTRYPOINTS_H
