//===- DriverApi.h - CUDA driver types the runtime declares itself -*- C++
//-*-===//
//
// The runtime opens the CUDA driver with dlopen and has no CUDA headers, so
// the few driver structures it passes are declared here, laid out as cuda.h
// (CUDA 12) lays them out. Private to the runtime library.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_DRIVERAPI_H
#define ATTNRES_RUNTIME_DRIVERAPI_H

#include <dlfcn.h>

namespace attnres::driver {

/// CUlaunchAttribute, with the one attribute the runtime sets: the cluster
/// dimensions.
struct LaunchAttribute {
  unsigned id; // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
  char pad[4];
  union {
    char bytes[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");

/// CUlaunchConfig (cuLaunchKernelEx).
struct LaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  void *stream;
  LaunchAttribute *attrs;
  unsigned numAttrs;
};

constexpr unsigned kClusterDimensionAttribute = 4;
/// CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH.
constexpr int kClusterLaunchDeviceAttribute = 120;

/// A launch of grid x block threads whose blocks form clusters of
/// cluster[0] x cluster[1] x cluster[2]; `attribute` must outlive the
/// returned configuration.
inline LaunchConfig clusterLaunch(const unsigned grid[3],
                                  const unsigned block[3],
                                  const unsigned cluster[3],
                                  unsigned sharedMemBytes, void *stream,
                                  LaunchAttribute &attribute) {
  attribute = {};
  attribute.id = kClusterDimensionAttribute;
  attribute.value.clusterDim = {cluster[0], cluster[1], cluster[2]};
  return {grid[0],  grid[1],        grid[2], block[0],   block[1],
          block[2], sharedMemBytes, stream,  &attribute, 1};
}

/// Looks `name` up in an opened library; false where it is missing.
template <typename F> bool bind(void *library, const char *name, F &function) {
  function = reinterpret_cast<F>(dlsym(library, name));
  return function != nullptr;
}

} // namespace attnres::driver

#endif // ATTNRES_RUNTIME_DRIVERAPI_H
