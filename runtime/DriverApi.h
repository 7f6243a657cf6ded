//===- DriverApi.h - Driver types the runtime declares itself ---*- C++ -*-===//
//
// The runtime opens the CUDA driver or HIP with dlopen and has no CUDA or
// HIP headers, so the few driver structures and constants it passes are
// declared here, laid out as cuda.h (CUDA 12) lays them out. Private to the
// runtime library.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_RUNTIME_DRIVERAPI_H
#define ATTNRES_RUNTIME_DRIVERAPI_H

#include <dlfcn.h>

#include <string>

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

/// The device attribute that counts multiprocessors (compute units):
/// CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, or
/// hipDeviceAttributeMultiprocessorCount (ROCm 5 and 6).
constexpr int multiprocessorCountAttribute(bool hip) { return hip ? 63 : 16; }

/// The largest grid the driver launches, per dimension.
inline constexpr long long kMaxGrid[3] = {2147483647, 65535, 65535};

/// What the runtime opens for each vendor, and what messages say of it.
struct Vendor {
  bool hip;
  const char *name;         // "the CUDA driver", "the HIP runtime"
  const char *libraries[2]; // tried in order; messages name the first
  const char *needs;        // "an NVIDIA GPU and its driver", ...
  const char *oldest;       // the oldest release with every entry point
};
inline constexpr Vendor kCuda{false,
                              "the CUDA driver",
                              {"libcuda.so.1", "libcuda.so"},
                              "an NVIDIA GPU and its driver",
                              "CUDA 11"};
inline constexpr Vendor kHip{true,
                             "the HIP runtime",
                             {"libamdhip64.so", "libamdhip64.so.6"},
                             "an AMD GPU with ROCm",
                             "ROCm 5"};

/// "cannot load the CUDA driver (libcuda.so.1): <reason>; <who> needs an
/// NVIDIA GPU and its driver": the message where `vendor` does not load.
inline std::string cannotLoad(const Vendor &vendor, const std::string &reason,
                              const char *who) {
  return std::string("cannot load ") + vendor.name + " (" +
         vendor.libraries[0] + "): " + reason + "; " + who + " needs " +
         vendor.needs;
}

/// Opens the first of `names` that loads (the CUDA driver or HIP), or
/// returns null with `reason` the loader's message for the first name (the
/// one an error message names).
inline void *openLibrary(const char *const (&names)[2], std::string &reason) {
  for (const char *name : names) {
    if (void *library = dlopen(name, RTLD_NOW | RTLD_LOCAL))
      return library;
    // dlerror() is cleared by each call: keep the first name's reason.
    if (const char *message = dlerror(); message && reason.empty())
      reason = message;
  }
  if (reason.empty())
    reason = "not found";
  return nullptr;
}

/// "CUDA error 4: <text>": a driver status as messages give it.
inline std::string describeResult(const char *api, int result,
                                  const char *text) {
  return std::string(api) + " error " + std::to_string(result) +
         (text ? std::string(": ") + text : "");
}

/// Looks `name` up in an opened library; false where it is missing.
template <typename F> bool bind(void *library, const char *name, F &function) {
  function = reinterpret_cast<F>(dlsym(library, name));
  return function != nullptr;
}

} // namespace attnres::driver

#endif // ATTNRES_RUNTIME_DRIVERAPI_H
