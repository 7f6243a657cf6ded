//===- EntryPoints.cpp - Bind the CUDA driver's or HIP's functions --------===//
//
// CUDA names are the symbols cuda.h maps its names to (the _v2 versions
// where it has them), so the binary interface is the one the declarations
// in EntryPoints.h follow.
//
//===----------------------------------------------------------------------===//

#include "EntryPoints.h"

namespace attnres::driver {

std::string EntryPoints::describe(Result result) const {
  const char *text = nullptr;
  if (getErrorString)
    getErrorString(result, &text);
  else if (hipErrorString)
    text = hipErrorString(result);
  return describeResult(api(), result, text);
}

static bool bindCuda(void *library, EntryPoints &d) {
  bool found = bind(library, "cuInit", d.init) &&
               bind(library, "cuDeviceGetCount", d.deviceGetCount) &&
               bind(library, "cuDeviceGet", d.deviceGet) &&
               bind(library, "cuDeviceGetAttribute", d.deviceGetAttribute) &&
               bind(library, "cuModuleLoadData", d.moduleLoadData) &&
               bind(library, "cuModuleUnload", d.moduleUnload) &&
               bind(library, "cuModuleGetFunction", d.moduleGetFunction) &&
               bind(library, "cuLaunchKernel", d.launchKernel) &&
               bind(library, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                    d.occupancy) &&
               bind(library, "cuStreamCreate", d.streamCreate) &&
               bind(library, "cuStreamDestroy_v2", d.streamDestroy) &&
               bind(library, "cuStreamSynchronize", d.streamSynchronize) &&
               bind(library, "cuStreamWaitEvent", d.streamWaitEvent) &&
               bind(library, "cuEventCreate", d.eventCreate) &&
               bind(library, "cuEventDestroy_v2", d.eventDestroy) &&
               bind(library, "cuEventSynchronize", d.eventSynchronize) &&
               bind(library, "cuEventRecord", d.eventRecord) &&
               bind(library, "cuMemAlloc_v2", d.memAlloc) &&
               bind(library, "cuMemAllocManaged", d.memAllocManaged) &&
               bind(library, "cuMemFree_v2", d.memFree) &&
               bind(library, "cuMemsetD32Async", d.memsetD32Async) &&
               bind(library, "cuMemsetD16Async", d.memsetD16Async) &&
               bind(library, "cuMemHostRegister_v2", d.memHostRegister) &&
               bind(library, "cuMemHostUnregister", d.memHostUnregister) &&
               bind(library, "cuDevicePrimaryCtxRetain", d.primaryCtxRetain) &&
               bind(library, "cuCtxPushCurrent_v2", d.ctxPushCurrent) &&
               bind(library, "cuCtxPopCurrent_v2", d.ctxPopCurrent) &&
               bind(library, "cuCtxGetCurrent", d.ctxGetCurrent) &&
               bind(library, "cuCtxGetDevice", d.ctxGetDevice) &&
               bind(library, "cuCtxSetCurrent", d.ctxSetCurrent) &&
               bind(library, "cuModuleLoadDataEx", d.moduleLoadDataEx) &&
               bind(library, "cuMemcpyAsync", d.memcpyAsync);
  bind(library, "cuGetErrorString", d.getErrorString);
  bind(library, "cuLaunchKernelEx", d.launchKernelEx);
  bind(library, "cuOccupancyMaxActiveClusters", d.occupancyMaxActiveClusters);
  if (!(bind(library, "cuCtxSynchronize", d.ctxSynchronize) &&
        bind(library, "cuMemPoolCreate", d.memPoolCreate) &&
        bind(library, "cuMemPoolSetAttribute", d.memPoolSetAttribute) &&
        bind(library, "cuMemPoolTrimTo", d.memPoolTrimTo) &&
        bind(library, "cuMemAllocFromPoolAsync", d.memAllocFromPoolAsync) &&
        bind(library, "cuMemFreeAsync", d.memFreeAsync))) {
    d.ctxSynchronize = nullptr;
    d.memPoolCreate = nullptr;
    d.memPoolSetAttribute = nullptr;
    d.memPoolTrimTo = nullptr;
    d.memAllocFromPoolAsync = nullptr;
    d.memFreeAsync = nullptr;
  }
  return found;
}

static bool bindHip(void *library, EntryPoints &d) {
  bool found =
      bind(library, "hipInit", d.init) &&
      bind(library, "hipGetDeviceCount", d.deviceGetCount) &&
      bind(library, "hipDeviceGet", d.deviceGet) &&
      bind(library, "hipDeviceGetAttribute", d.deviceGetAttribute) &&
      bind(library, "hipModuleLoadData", d.moduleLoadData) &&
      bind(library, "hipModuleUnload", d.moduleUnload) &&
      bind(library, "hipModuleGetFunction", d.moduleGetFunction) &&
      bind(library, "hipModuleLaunchKernel", d.launchKernel) &&
      bind(library, "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
           d.occupancy) &&
      bind(library, "hipStreamCreateWithFlags", d.streamCreate) &&
      bind(library, "hipStreamDestroy", d.streamDestroy) &&
      bind(library, "hipStreamSynchronize", d.streamSynchronize) &&
      bind(library, "hipStreamWaitEvent", d.streamWaitEvent) &&
      bind(library, "hipEventCreateWithFlags", d.eventCreate) &&
      bind(library, "hipEventDestroy", d.eventDestroy) &&
      bind(library, "hipEventSynchronize", d.eventSynchronize) &&
      bind(library, "hipEventRecord", d.eventRecord) &&
      bind(library, "hipMalloc", d.memAlloc) &&
      bind(library, "hipMallocManaged", d.memAllocManaged) &&
      bind(library, "hipFree", d.memFree) &&
      bind(library, "hipMemsetD32Async", d.memsetD32Async) &&
      bind(library, "hipMemsetD16Async", d.memsetD16Async) &&
      bind(library, "hipHostRegister", d.memHostRegister) &&
      bind(library, "hipHostUnregister", d.memHostUnregister) &&
      bind(library, "hipSetDevice", d.setDevice) &&
      bind(library, "hipGetDevice", d.getDevice) &&
      bind(library, "hipMemcpyAsync", d.hipMemcpyAsync);
  bind(library, "hipGetErrorString", d.hipErrorString);
  return found;
}

bool bindEntryPoints(void *library, const Vendor &vendor, EntryPoints &d) {
  d = EntryPoints();
  d.hip = vendor.hip;
  return vendor.hip ? bindHip(library, d) : bindCuda(library, d);
}

std::string lacksEntryPoint(const Vendor &vendor, const char *who) {
  return std::string(vendor.name) + " (" + vendor.libraries[0] +
         ") lacks an entry point " + who + " needs (" + vendor.oldest +
         " or later has them)";
}

} // namespace attnres::driver
