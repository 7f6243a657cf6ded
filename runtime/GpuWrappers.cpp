//===- GpuWrappers.cpp - MLIR's mgpu* host entry points over CUDA or HIP --===//
//
// The functions MLIR's host lowering calls (attnres-c/GpuWrappers.h), over
// the CUDA driver or HIP, opened with dlopen on first use: the first kernel
// image the process gave decides which (NVVM's cubin, fatbin or PTX, or
// ROCDL's hsaco). Each reports a failure on stderr and in a thread-local
// message instead of aborting: the generated code that calls them has no way to
// receive a status.
//
//===----------------------------------------------------------------------===//

#include "attnres-c/GpuWrappers.h"

#include "DriverApi.h"
#include "EntryPoints.h"
#include "attnres/Bundle/LaunchRules.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using attnres::driver::Result;

/// The CUDA driver or HIP (EntryPoints.h): HIP has no contexts to make
/// current (hipSetDevice instead), no clusters, no PTX, and its copy takes
/// a direction; its device memory comes from hipMalloc (no pool).
struct Driver : attnres::driver::EntryPoints {
  std::string unusable; // why the driver cannot be used; empty when it can
};

// cuda.h's values of the flags used below.
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
constexpr unsigned kEventDisableTiming = 2; // CU_EVENT_DISABLE_TIMING
constexpr unsigned kMemAttachGlobal = 1;    // CU_MEM_ATTACH_GLOBAL
constexpr int kJitOptimizationLevel = 7;    // CU_JIT_OPTIMIZATION_LEVEL
constexpr int kHipMemcpyDefault = 4;        // hipMemcpyDefault

/// CUDA_ERROR_DEINITIALIZED: the driver is shutting down (the process is
/// exiting) and has released everything itself.
constexpr Result kDeinitialized = 4;

/// What a kernel image given to mgpuModuleLoad is code for, read from its
/// first bytes.
enum ImageKind : unsigned {
  kUnknownImage = 0,
  kNvidiaImage = 1,
  kAmdImage = 2
};

ImageKind imageKind(const char *data, size_t size) {
  // ELF's e_machine (EM_CUDA = 190: a cubin; EM_AMDGPU = 224: a hsaco).
  if (size >= 20 && std::memcmp(data,
                                "\x7f"
                                "ELF",
                                4) == 0) {
    uint16_t machine = 0;
    std::memcpy(&machine, data + 18, sizeof(machine));
    return machine == 190   ? kNvidiaImage
           : machine == 224 ? kAmdImage
                            : kUnknownImage;
  }
  uint32_t magic = 0;
  if (size >= 4)
    std::memcpy(&magic, data, sizeof(magic));
  if (magic == 0xBA55ED50u) // a fatbin
    return kNvidiaImage;
  static const char bundle[] = "__CLANG_OFFLOAD_BUNDLE__";
  if (size >= sizeof(bundle) - 1 &&
      std::memcmp(data, bundle, sizeof(bundle) - 1) == 0)
    return kAmdImage;
  return kUnknownImage;
}

const char *describeImageKind(unsigned kind) {
  return kind == kAmdImage ? "AMD GPU code (hsaco)"
                           : "NVIDIA GPU code (cubin, fatbin or PTX)";
}

/// The kind of the first image given (a recognized one), which decides
/// whether the process runs on the CUDA driver or on HIP.
std::atomic<unsigned> firstImageKind{kUnknownImage};

void imageGiven(ImageKind kind) {
  unsigned unknown = kUnknownImage;
  if (kind != kUnknownImage)
    firstImageKind.compare_exchange_strong(unknown, kind);
}

/// Opens `vendor`'s library, binds its entry points and initializes it;
/// `d.unusable` says why where a step fails.
Driver loadDriver(const attnres::driver::Vendor &vendor) {
  Driver d;
  d.hip = vendor.hip;
  std::string reason;
  void *library = attnres::driver::openLibrary(vendor.libraries, reason);
  if (!library) {
    d.unusable = attnres::driver::cannotLoad(vendor, reason, "the code");
    return d;
  }
  if (!attnres::driver::bindEntryPoints(library, vendor, d)) {
    d.unusable =
        attnres::driver::lacksEntryPoint(vendor, "the mgpu* functions");
    return d;
  }
  if (Result result = d.init(0))
    d.unusable =
        std::string("initializing ") + vendor.name + ": " + d.describe(result);
  return d;
}

/// HIP where the first image given is AMD GPU code, CUDA where it is
/// NVIDIA code; before any image, CUDA where its driver loads, else HIP
/// where it loads, else CUDA (whose error is reported).
bool chooseHip() {
  if (unsigned first = firstImageKind.load(); first != kUnknownImage)
    return first == kAmdImage;
  std::string reason;
  // Libraries opened here stay open (dlopen counts them): checking costs a
  // second open only of the one that is used.
  if (attnres::driver::openLibrary(attnres::driver::kCuda.libraries, reason))
    return false;
  reason.clear();
  return attnres::driver::openLibrary(attnres::driver::kHip.libraries,
                                      reason) != nullptr;
}

// Host code frees and unloads from static destructors, which run in no
// fixed order with this library's: everything below that outlives a call is
// never destroyed (the driver table and the contexts are leaked on purpose,
// the last error is a plain array).
const Driver &driver() {
  static const Driver *loaded = new Driver(
      loadDriver(chooseHip() ? attnres::driver::kHip : attnres::driver::kCuda));
  return *loaded;
}

thread_local char lastError[1024];
thread_local bool hasLastError = false;
thread_local int defaultDevice = 0;

void report(const char *function, const std::string &message) {
  std::snprintf(lastError, sizeof(lastError), "%s: %s", function,
                message.c_str());
  hasLastError = true;
  std::fprintf(stderr, "attnres runtime: %s\n", lastError);
}

/// The driver, or null (reported) where it cannot be used.
const Driver *usableDriver(const char *function) {
  const Driver &d = driver();
  if (!d.unusable.empty()) {
    report(function, d.unusable);
    return nullptr;
  }
  return &d;
}

/// Whether `result` is success; reports it otherwise.
bool succeeded(const char *function, const Driver &d, Result result) {
  if (result)
    report(function, d.describe(result));
  return result == 0;
}

/// The same for a release (unload, destroy, free): one that comes after
/// the driver shut down at exit has nothing left to release.
void released(const char *function, const Driver &d, Result result) {
  if (result != kDeinitialized)
    succeeded(function, d, result);
}

/// Makes the primary context of the thread's default device current for its
/// lifetime (the driver call needs one; the caller's current context, if
/// any, is restored).
class DeviceScope {
public:
  /// `release`: the call releases something, which needs no report once the
  /// driver has shut down at exit.
  explicit DeviceScope(const char *function, bool release = false) {
    d = usableDriver(function);
    if (!d)
      return;
    if (d->hip) {
      // HIP's current device is per thread, as a context would be.
      Result result = d->getDevice(&previousDevice);
      if (!result && previousDevice != defaultDevice)
        result = d->setDevice(defaultDevice);
      if (!result) {
        pushed = true;
        return;
      }
      if (!(release && result == kDeinitialized))
        succeeded(function, *d, result);
      d = nullptr;
      return;
    }
    void *context = primaryContext(function, *d, defaultDevice);
    Result result = context ? d->ctxPushCurrent(context) : 0;
    if (context && !result) {
      pushed = true;
      return;
    }
    if (context && !(release && result == kDeinitialized))
      succeeded(function, *d, result);
    d = nullptr;
  }
  ~DeviceScope() {
    if (!pushed)
      return;
    if (d->hip) {
      if (previousDevice != defaultDevice)
        d->setDevice(previousDevice);
      return;
    }
    void *previous = nullptr;
    d->ctxPopCurrent(&previous);
  }
  DeviceScope(const DeviceScope &) = delete;
  DeviceScope &operator=(const DeviceScope &) = delete;

  /// The driver where the scope holds a context, else null (reported).
  const Driver *get() const { return d; }

private:
  static void *primaryContext(const char *function, const Driver &d,
                              int ordinal) {
    static std::mutex *mutex = new std::mutex;
    // Retained once each, never released.
    static std::map<int, void *> *contexts = new std::map<int, void *>;
    std::lock_guard<std::mutex> lock(*mutex);
    auto found = contexts->find(ordinal);
    if (found != contexts->end())
      return found->second;
    int device = 0;
    void *context = nullptr;
    if (!succeeded(function, d, d.deviceGet(&device, ordinal)) ||
        !succeeded(function, d, d.primaryCtxRetain(&context, device)))
      return nullptr;
    (*contexts)[ordinal] = context;
    return context;
  }

  const Driver *d = nullptr;
  bool pushed = false;
  int previousDevice = 0; // HIP: the thread's device before the scope
};

unsigned long long address(const void *pointer) {
  return reinterpret_cast<unsigned long long>(pointer);
}

/// Whether a launch's dimensions are ones the driver takes; reports the
/// first that is not.
bool validLaunch(const char *function, const void *kernel,
                 const intptr_t grid[3], const intptr_t block[3],
                 int32_t sharedMemBytes) {
  if (!kernel) {
    report(function, "no kernel (its lookup failed)");
    return false;
  }
  const char *axis[3] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i) {
    if (grid[i] < 1 || grid[i] > attnres::driver::kMaxGrid[i]) {
      report(function, std::string("grid size ") + axis[i] + " = " +
                           std::to_string(grid[i]) + " is outside [1, " +
                           std::to_string(attnres::driver::kMaxGrid[i]) + "]");
      return false;
    }
    if (block[i] < 1 || block[i] > 1024) {
      report(function, std::string("block size ") + axis[i] + " = " +
                           std::to_string(block[i]) + " is outside [1, 1024]");
      return false;
    }
  }
  if (sharedMemBytes < 0) {
    report(function, "dynamic shared memory of " +
                         std::to_string(sharedMemBytes) + " bytes");
    return false;
  }
  return true;
}

/// The bytes of the dense memref whose ranked descriptor is `descriptor`,
/// and its first element, or 0 (reported) where it is not dense.
size_t denseMemRef(const char *function, int64_t rank, void *descriptor,
                   int64_t elementBytes, char *&first) {
  if (!descriptor || rank < 0 || elementBytes < 1) {
    report(function, "a null memref descriptor, a negative rank or an "
                     "element size below one byte");
    return 0;
  }
  // { T *allocated, *aligned; int64_t offset, sizes[rank], strides[rank]; }
  auto *pointers = static_cast<char **>(descriptor);
  auto *integers = reinterpret_cast<int64_t *>(pointers + 2);
  const int64_t *sizes = integers + 1, *strides = integers + 1 + rank;
  int64_t elements = 1, bytes, offsetBytes;
  for (int64_t i = rank - 1; i >= 0; --i) {
    if (sizes[i] != 1 && strides[i] != elements) {
      report(function, "the memref is not dense (dimension " +
                           std::to_string(i) + " has stride " +
                           std::to_string(strides[i]) + ", not " +
                           std::to_string(elements) + ")");
      return 0;
    }
    if (sizes[i] < 0 || __builtin_mul_overflow(elements, sizes[i], &elements)) {
      report(function, "the memref's size " + std::to_string(sizes[i]) +
                           " (dimension " + std::to_string(i) +
                           ") is negative or its elements overflow 64 bits");
      return 0;
    }
  }
  if (__builtin_mul_overflow(elements, elementBytes, &bytes) ||
      __builtin_mul_overflow(integers[0], elementBytes, &offsetBytes)) {
    report(function, "the memref's bytes or offset overflow 64 bits");
    return 0;
  }
  first = pointers[1] + offsetBytes;
  return static_cast<size_t>(bytes);
}

/// A handle `make` creates in the default device's context, or null
/// (reported).
template <typename Make> void *created(const char *function, Make make) {
  DeviceScope scope(function);
  if (!scope.get())
    return nullptr;
  void *handle = nullptr;
  if (!succeeded(function, *scope.get(), make(*scope.get(), &handle)))
    return nullptr;
  return handle;
}

/// Releases `handle` with `release`; a null handle is one whose creation
/// failed and was reported.
template <typename Release>
void releaseHandle(const char *function, void *handle, Release release) {
  if (!handle)
    return;
  if (const Driver *d = usableDriver(function))
    released(function, *d, release(*d, handle));
}

/// Runs `use` on an event, which must exist.
template <typename Use>
void withEvent(const char *function, void *event, Use use) {
  const Driver *d = usableDriver(function);
  if (!d)
    return;
  if (!event) {
    report(function, "no event (its creation failed)");
    return;
  }
  succeeded(function, *d, use(*d, event));
}

/// A kernel image given to mgpuModuleLoad or mgpuModuleLoadJIT, loaded into
/// a device's context on its first use there (a kernel lookup, an
/// occupancy query) rather than when it is given: upstream's host code
/// gives its images from a constructor, when the process (or a library
/// loading into it) starts, and initializing CUDA then would make a process
/// that forks before using the GPU (a data loader's workers) unable to use
/// it in the children, and would start the driver before a tool that must
/// come first (compute-sanitizer). The image is copied: a caller may free
/// its buffer once the call returns, as with the driver's own load.
struct LazyModule {
  std::string image;
  ImageKind kind = kUnknownImage;
  bool jit = false;
  int optLevel = 0;
  std::map<int, void *> loaded; // device ordinal -> CUmodule
};

/// The modules given and not unloaded, for the occupancy queries
/// (attnresGpuResidentBlocks, attnresGpuClusterCapacity), which look a
/// kernel up by name: the host code that asks has no module handle
/// (upstream's lowering keeps it in a private global). The answers are
/// kept, since generated code asks at every call and a kernel's occupancy
/// does not change; giving or unloading a module forgets them.
class LoadedModules {
public:
  /// A kernel's name, its block threads, its cluster's blocks (0: the
  /// resident-blocks query) and the device.
  using Question = std::tuple<std::string, int64_t, int64_t, int>;

  static void add(LazyModule *module) {
    std::lock_guard<std::mutex> lock(mutex());
    modules().push_back(module);
    answers().clear();
  }
  static void remove(LazyModule *module) {
    std::lock_guard<std::mutex> lock(mutex());
    auto &all = modules();
    all.erase(std::remove(all.begin(), all.end(), module), all.end());
    answers().clear();
  }
  /// The module's CUmodule in the context of the thread's default device,
  /// loaded there first if need be; null (reported) where that fails.
  static void *load(const char *function, LazyModule &module) {
    std::lock_guard<std::mutex> lock(mutex());
    return loadLocked(function, module);
  }
  /// The kernel named `name` of the latest given module that has one, or
  /// null.
  static void *find(const char *function, const Driver &d, const char *name) {
    std::lock_guard<std::mutex> lock(mutex());
    for (auto it = modules().rbegin(); it != modules().rend(); ++it) {
      void *kernel = nullptr;
      // A module that does not load here (one built for another device)
      // is skipped quietly: its own lookups report it.
      if (void *loaded = loadLocked(function, **it, /*quiet=*/true);
          loaded && !d.moduleGetFunction(&kernel, loaded, name))
        return kernel;
    }
    return nullptr;
  }
  static bool answered(const Question &question, int64_t &answer) {
    std::lock_guard<std::mutex> lock(mutex());
    auto found = answers().find(question);
    if (found == answers().end())
      return false;
    answer = found->second;
    return true;
  }
  static void remember(const Question &question, int64_t answer) {
    std::lock_guard<std::mutex> lock(mutex());
    answers()[question] = answer;
  }

private:
  static void *loadLocked(const char *function, LazyModule &module,
                          bool quiet = false) {
    auto found = module.loaded.find(defaultDevice);
    if (found != module.loaded.end())
      return found->second;
    DeviceScope scope(function);
    const Driver *d = scope.get();
    if (!d)
      return nullptr;
    if (module.kind != kUnknownImage && (module.kind == kAmdImage) != d->hip) {
      if (!quiet)
        report(function, std::string("the kernel image is ") +
                             describeImageKind(module.kind) +
                             " but this process runs its GPU code on " +
                             d->api() + " (chosen by the first image given)");
      return nullptr;
    }
    void *loaded = nullptr;
    Result result;
    if (module.jit) {
      int options[] = {kJitOptimizationLevel};
      void *values[] = {
          reinterpret_cast<void *>(static_cast<intptr_t>(module.optLevel))};
      result =
          d->moduleLoadDataEx(&loaded, module.image.data(), 1, options, values);
    } else {
      result = d->moduleLoadData(&loaded, module.image.data());
    }
    if (result) {
      if (!quiet)
        report(function, d->describe(result));
      return nullptr;
    }
    module.loaded[defaultDevice] = loaded;
    return loaded;
  }

  // Never destroyed, as the state above: modules unload from destructors.
  static std::mutex &mutex() {
    static std::mutex *instance = new std::mutex;
    return *instance;
  }
  static std::vector<LazyModule *> &modules() {
    static auto *instance = new std::vector<LazyModule *>;
    return *instance;
  }
  static std::map<Question, int64_t> &answers() {
    static auto *instance = new std::map<Question, int64_t>;
    return *instance;
  }
};

/// An occupancy query of the kernel named `kernelName` in blocks of
/// `blockThreads` threads (`clusterBlocks` > 0: in clusters of that many
/// blocks): the kept answer, else `ask`'s (kept where it succeeded). 0
/// (reported) where the arguments are wrong, the kernel is not loaded or
/// the driver fails.
template <typename Ask>
int64_t occupancyQuery(const char *function, const char *kernelName,
                       int64_t blockThreads, int64_t clusterBlocks, Ask ask) {
  if (!kernelName) {
    report(function, "no kernel name");
    return 0;
  }
  if (blockThreads < 1 || blockThreads > 1024) {
    report(function, "a block of " + std::to_string(blockThreads) +
                         " threads (outside [1, 1024])");
    return 0;
  }
  if (clusterBlocks < 0 || clusterBlocks > attnres::launch::kMaxClusterBlocks) {
    report(function, "a cluster of " + std::to_string(clusterBlocks) +
                         " blocks (outside [1, " +
                         std::to_string(attnres::launch::kMaxClusterBlocks) +
                         "])");
    return 0;
  }
  LoadedModules::Question question{kernelName, blockThreads, clusterBlocks,
                                   defaultDevice};
  int64_t answer = 0;
  if (LoadedModules::answered(question, answer))
    return answer;
  DeviceScope scope(function);
  const Driver *d = scope.get();
  if (!d)
    return 0;
  void *kernel = LoadedModules::find(function, *d, kernelName);
  if (!kernel) {
    report(function,
           std::string("no loaded module has a kernel '") + kernelName + "'");
    return 0;
  }
  if (!ask(*d, kernel, answer))
    return 0;
  LoadedModules::remember(question, answer);
  return answer;
}

/// CUmemPoolProps (cuMemPoolCreate): pinned memory of one device.
struct PoolProperties {
  int allocType = 1;    // CU_MEM_ALLOCATION_TYPE_PINNED
  int handleTypes = 0;  // CU_MEM_HANDLE_TYPE_NONE
  int locationType = 1; // CU_MEM_LOCATION_TYPE_DEVICE
  int locationId = 0;
  void *win32SecurityAttributes = nullptr;
  unsigned char rest[64] = {}; // maxSize (0: the default), usage, reserved
};
static_assert(sizeof(PoolProperties) == 88, "CUmemPoolProps is 88 bytes");
// CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
// CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED.
constexpr int kPoolReleaseThreshold = 4;
constexpr int kMemoryPoolsSupported = 115;

/// Where mgpuMemAlloc's device memory comes from: a stream-ordered pool per
/// device that keeps what is freed for the next allocation. Upstream's host
/// code allocates its results and workspaces at every call and frees them
/// after it, and cuMemAlloc and cuMemFree (which waits for the device) cost
/// more than a small call's kernels (docs/Performance.md, "The keep-host
/// path").
class DevicePools {
public:
  /// The pool of the thread's default device (whose context must be
  /// current), or null where the driver or the device has none.
  static void *pool(const Driver &d) {
    if (!d.memPoolCreate)
      return nullptr;
    std::lock_guard<std::mutex> lock(mutex());
    auto found = pools().find(defaultDevice);
    if (found != pools().end())
      return found->second;
    void *pool = nullptr;
    int device = 0, supported = 0;
    PoolProperties properties;
    if (!d.deviceGet(&device, defaultDevice) &&
        !d.deviceGetAttribute(&supported, kMemoryPoolsSupported, device) &&
        supported) {
      properties.locationId = device;
      // Kept until attnresGpuReleaseCachedMemory rather than released at
      // each synchronization (the default threshold, 0).
      uint64_t keepAll = UINT64_MAX;
      if (d.memPoolCreate(&pool, &properties) ||
          d.memPoolSetAttribute(pool, kPoolReleaseThreshold, &keepAll))
        pool = nullptr;
    }
    pools()[defaultDevice] = pool; // null: cuMemAlloc on this device
    return pool;
  }
  /// Whether `pointer` came from a pool; forgets it.
  static bool take(const void *pointer) {
    std::lock_guard<std::mutex> lock(mutex());
    return pointers().erase(pointer) > 0;
  }
  static void remember(const void *pointer) {
    std::lock_guard<std::mutex> lock(mutex());
    pointers().insert(pointer);
  }
  static std::vector<void *> all() {
    std::lock_guard<std::mutex> lock(mutex());
    std::vector<void *> result;
    for (auto [device, pool] : pools())
      if (pool)
        result.push_back(pool);
    return result;
  }

private:
  // Never destroyed, as the state above.
  static std::mutex &mutex() {
    static std::mutex *instance = new std::mutex;
    return *instance;
  }
  static std::map<int, void *> &pools() {
    static auto *instance = new std::map<int, void *>;
    return *instance;
  }
  static std::set<const void *> &pointers() {
    static auto *instance = new std::set<const void *>;
    return *instance;
  }
};

/// Streams mgpuStreamDestroy was given, kept for the next mgpuStreamCreate
/// on the same device: upstream's host code (gpu-async-region) creates and
/// destroys a stream at every call of a function, and cuStreamCreate /
/// cuStreamDestroy cost as much as a small call's kernels. At most
/// kKeptStreams a device; work still queued on a kept stream runs before
/// what the next user gives it.
class StreamCache {
public:
  static constexpr size_t kKeptStreams = 8;

  /// A kept stream of the thread's default device, or null.
  static void *take() {
    std::lock_guard<std::mutex> lock(mutex());
    auto &streams = kept()[defaultDevice];
    if (streams.empty())
      return nullptr;
    void *stream = streams.back();
    streams.pop_back();
    return stream;
  }
  static void created(void *stream) {
    std::lock_guard<std::mutex> lock(mutex());
    owner()[stream] = defaultDevice;
  }
  enum class Kept { Yes, No, Already };
  /// Keeps `stream` (one mgpuStreamCreate made) where there is room; if not,
  /// the caller destroys it. A stream already kept was destroyed twice.
  static Kept keep(void *stream) {
    std::lock_guard<std::mutex> lock(mutex());
    auto found = owner().find(stream);
    if (found == owner().end())
      return Kept::No;
    auto &streams = kept()[found->second];
    if (std::find(streams.begin(), streams.end(), stream) != streams.end())
      return Kept::Already;
    if (streams.size() >= kKeptStreams) {
      owner().erase(found);
      return Kept::No;
    }
    streams.push_back(stream);
    return Kept::Yes;
  }

private:
  // Never destroyed, as the state above.
  static std::mutex &mutex() {
    static std::mutex *instance = new std::mutex;
    return *instance;
  }
  static std::map<int, std::vector<void *>> &kept() {
    static auto *instance = new std::map<int, std::vector<void *>>;
    return *instance;
  }
  static std::map<void *, int> &owner() {
    static auto *instance = new std::map<void *, int>;
    return *instance;
  }
};

/// Issues a fill of `count` elements at `destination` with `fill`.
template <typename Fill>
void fillDevice(const char *function, void *destination, size_t count,
                Fill fill) {
  if (!count)
    return;
  DeviceScope scope(function);
  if (!scope.get())
    return;
  if (!destination) {
    report(function, "filling a null pointer (a failed allocation?)");
    return;
  }
  succeeded(function, *scope.get(), fill(*scope.get(), address(destination)));
}

} // namespace

extern "C" {

const char *attnresGpuLastError(void) {
  return hasLastError ? lastError : nullptr;
}

void attnresGpuRefuseLaunch(const char *reason) {
  report("attnresGpuRefuseLaunch", reason ? reason : "(no reason given)");
}

void attnresGpuClearError(void) {
  hasLastError = false;
  lastError[0] = '\0';
}

void *mgpuModuleLoad(void *data, size_t size) {
  if (!data || !size) {
    report("mgpuModuleLoad", "no kernel image (null or empty)");
    return nullptr;
  }
  auto *module = new LazyModule;
  module->image.assign(static_cast<const char *>(data), size);
  module->kind = imageKind(module->image.data(), size);
  imageGiven(module->kind);
  LoadedModules::add(module);
  return module;
}

void *mgpuModuleLoadJIT(void *data, int optLevel) {
  const char *function = "mgpuModuleLoadJIT";
  if (!data) {
    report(function, "no PTX (null)");
    return nullptr;
  }
  if (optLevel < 0 || optLevel > 4) {
    report(function, "optimization level " + std::to_string(optLevel) +
                         " is outside [0, 4]");
    return nullptr;
  }
  auto *module = new LazyModule;
  // The PTX text with its terminating NUL, as the driver reads it.
  module->image.assign(static_cast<const char *>(data),
                       std::strlen(static_cast<const char *>(data)) + 1);
  module->kind = kNvidiaImage;
  imageGiven(kNvidiaImage);
  module->jit = true;
  module->optLevel = optLevel;
  LoadedModules::add(module);
  return module;
}

void mgpuModuleUnload(void *handle) {
  if (!handle)
    return;
  auto *module = static_cast<LazyModule *>(handle);
  LoadedModules::remove(module);
  for (auto [device, loaded] : module->loaded)
    releaseHandle("mgpuModuleUnload", loaded,
                  [](const Driver &d, void *h) { return d.moduleUnload(h); });
  delete module;
}

void *mgpuModuleGetFunction(void *module, const char *name) {
  const char *function = "mgpuModuleGetFunction";
  const Driver *d = usableDriver(function);
  if (!d)
    return nullptr;
  if (!module || !name) {
    report(function, std::string("no module (its load failed) or no name, "
                                 "looking up '") +
                         (name ? name : "(null)") + "'");
    return nullptr;
  }
  void *loaded =
      LoadedModules::load(function, *static_cast<LazyModule *>(module));
  if (!loaded)
    return nullptr;
  void *kernel = nullptr;
  if (d->moduleGetFunction(&kernel, loaded, name)) {
    report(function, std::string("the module has no kernel '") + name + "'");
    return nullptr;
  }
  return kernel;
}

int64_t attnresGpuResidentBlocks(const char *kernelName, int64_t blockThreads) {
  const char *function = "attnresGpuResidentBlocks";
  return occupancyQuery(
      function, kernelName, blockThreads, 0,
      [&](const Driver &d, void *kernel, int64_t &answer) {
        int perMultiprocessor = 0, multiprocessors = 0, device = 0;
        if (!succeeded(function, d,
                       d.occupancy(&perMultiprocessor, kernel,
                                   static_cast<int>(blockThreads), 0)) ||
            !succeeded(function, d, d.deviceGet(&device, defaultDevice)) ||
            !succeeded(function, d,
                       d.deviceGetAttribute(
                           &multiprocessors,
                           attnres::driver::multiprocessorCountAttribute(d.hip),
                           device)))
          return false;
        answer = int64_t(perMultiprocessor) * multiprocessors;
        return true;
      });
}

int64_t attnresGpuClusterCapacity(const char *kernelName, int64_t blockThreads,
                                  int64_t clusterBlocks) {
  const char *function = "attnresGpuClusterCapacity";
  if (clusterBlocks < 1) {
    report(function,
           "a cluster of " + std::to_string(clusterBlocks) + " blocks");
    return 0;
  }
  // ATTNRES_NO_CLUSTERS=1 keeps clustered kernels out, for comparisons, as
  // it does in the bundle runtime.
  const char *noClusters = std::getenv("ATTNRES_NO_CLUSTERS");
  if (noClusters && *noClusters && *noClusters != '0')
    return 0;
  return occupancyQuery(
      function, kernelName, blockThreads, clusterBlocks,
      [&](const Driver &d, void *kernel, int64_t &answer) {
        // A driver before CUDA 12 has no clusters: none fit.
        if (!d.occupancyMaxActiveClusters) {
          answer = 0;
          return true;
        }
        const unsigned blocks = static_cast<unsigned>(clusterBlocks);
        const unsigned grid[3] = {1, blocks, 1};
        const unsigned block[3] = {static_cast<unsigned>(blockThreads), 1, 1};
        const unsigned cluster[3] = {1, blocks, 1};
        attnres::driver::LaunchAttribute attribute;
        attnres::driver::LaunchConfig config = attnres::driver::clusterLaunch(
            grid, block, cluster, 0, nullptr, attribute);
        int clusters = 0;
        if (!succeeded(
                function, d,
                d.occupancyMaxActiveClusters(&clusters, kernel, &config)))
          return false;
        answer = clusters;
        return true;
      });
}

void mgpuLaunchKernel(void *kernel, intptr_t gridX, intptr_t gridY,
                      intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                      intptr_t blockZ, int32_t sharedMemBytes, void *stream,
                      void **params, void **extra, size_t /*paramsCount*/) {
  const char *function = "mgpuLaunchKernel";
  DeviceScope scope(function);
  if (!scope.get())
    return;
  const intptr_t grid[3] = {gridX, gridY, gridZ};
  const intptr_t block[3] = {blockX, blockY, blockZ};
  if (!validLaunch(function, kernel, grid, block, sharedMemBytes))
    return;
  succeeded(function, *scope.get(),
            scope.get()->launchKernel(kernel, gridX, gridY, gridZ, blockX,
                                      blockY, blockZ, sharedMemBytes, stream,
                                      params, extra));
}

void mgpuLaunchClusterKernel(void *kernel, intptr_t clusterX, intptr_t clusterY,
                             intptr_t clusterZ, intptr_t gridX, intptr_t gridY,
                             intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                             intptr_t blockZ, int32_t sharedMemBytes,
                             void *stream, void **params, void **extra) {
  const char *function = "mgpuLaunchClusterKernel";
  DeviceScope scope(function);
  const Driver *d = scope.get();
  if (!d)
    return;
  const intptr_t grid[3] = {gridX, gridY, gridZ};
  const intptr_t block[3] = {blockX, blockY, blockZ};
  const intptr_t cluster[3] = {clusterX, clusterY, clusterZ};
  if (!validLaunch(function, kernel, grid, block, sharedMemBytes))
    return;
  for (int i = 0; i < 3; ++i)
    if (cluster[i] < 1 || grid[i] % cluster[i]) {
      report(function,
             "cluster " + std::to_string(clusterX) + " x " +
                 std::to_string(clusterY) + " x " + std::to_string(clusterZ) +
                 " does not divide the grid " + std::to_string(gridX) + " x " +
                 std::to_string(gridY) + " x " + std::to_string(gridZ));
      return;
    }
  if (!d->launchKernelEx) {
    report(function, d->hip ? "HIP has no thread-block clusters"
                            : "this CUDA driver has no cuLaunchKernelEx "
                              "(clusters need CUDA 12 and an sm_90 or "
                              "later GPU)");
    return;
  }
  const unsigned gridDims[3] = {unsigned(gridX), unsigned(gridY),
                                unsigned(gridZ)};
  const unsigned blockDims[3] = {unsigned(blockX), unsigned(blockY),
                                 unsigned(blockZ)};
  const unsigned clusterDims[3] = {unsigned(clusterX), unsigned(clusterY),
                                   unsigned(clusterZ)};
  attnres::driver::LaunchAttribute attribute;
  attnres::driver::LaunchConfig config = attnres::driver::clusterLaunch(
      gridDims, blockDims, clusterDims, unsigned(sharedMemBytes), stream,
      attribute);
  succeeded(function, *d, d->launchKernelEx(&config, kernel, params, extra));
}

void *mgpuStreamCreate(void) {
  if (void *kept = StreamCache::take())
    return kept;
  void *stream = created("mgpuStreamCreate", [](const Driver &d, void **h) {
    return d.streamCreate(h, kStreamNonBlocking);
  });
  if (stream)
    StreamCache::created(stream);
  return stream;
}

void mgpuStreamDestroy(void *stream) {
  if (!stream)
    return;
  switch (StreamCache::keep(stream)) {
  case StreamCache::Kept::Yes:
    return;
  case StreamCache::Kept::Already:
    report("mgpuStreamDestroy", "the stream was destroyed already");
    return;
  case StreamCache::Kept::No:
    break;
  }
  releaseHandle("mgpuStreamDestroy", stream,
                [](const Driver &d, void *h) { return d.streamDestroy(h); });
}

void mgpuStreamSynchronize(void *stream) {
  const char *function = "mgpuStreamSynchronize";
  DeviceScope scope(function);
  if (scope.get())
    succeeded(function, *scope.get(), scope.get()->streamSynchronize(stream));
}

void mgpuStreamWaitEvent(void *stream, void *event) {
  withEvent("mgpuStreamWaitEvent", event, [&](const Driver &d, void *e) {
    return d.streamWaitEvent(stream, e, 0);
  });
}

void *mgpuEventCreate(void) {
  return created("mgpuEventCreate", [](const Driver &d, void **h) {
    return d.eventCreate(h, kEventDisableTiming);
  });
}

void mgpuEventDestroy(void *event) {
  releaseHandle("mgpuEventDestroy", event,
                [](const Driver &d, void *h) { return d.eventDestroy(h); });
}

void mgpuEventSynchronize(void *event) {
  withEvent("mgpuEventSynchronize", event,
            [](const Driver &d, void *e) { return d.eventSynchronize(e); });
}

void mgpuEventRecord(void *event, void *stream) {
  withEvent("mgpuEventRecord", event,
            [&](const Driver &d, void *e) { return d.eventRecord(e, stream); });
}

void *mgpuMemAlloc(uint64_t sizeBytes, void *stream, bool hostShared) {
  const char *function = "mgpuMemAlloc";
  if (!sizeBytes)
    return nullptr; // an empty buffer; freeing it is a no-op
  DeviceScope scope(function);
  const Driver *d = scope.get();
  if (!d)
    return nullptr;
  unsigned long long pointer = 0;
  void *pool = hostShared ? nullptr : DevicePools::pool(*d);
  Result result;
  if (hostShared)
    result = d->memAllocManaged(&pointer, sizeBytes, kMemAttachGlobal);
  else if (pool) {
    result = d->memAllocFromPoolAsync(&pointer, sizeBytes, pool, stream);
    // What the pool keeps may be what is missing: give it back and retry.
    if (result && !d->ctxSynchronize() && !d->memPoolTrimTo(pool, 0))
      result = d->memAllocFromPoolAsync(&pointer, sizeBytes, pool, stream);
  } else
    result = d->memAlloc(&pointer, sizeBytes);
  if (result) {
    report(function, "allocating " + std::to_string(sizeBytes) + " bytes" +
                         (hostShared ? " of managed memory" : "") + ": " +
                         d->describe(result));
    return nullptr;
  }
  if (pool) {
    DevicePools::remember(reinterpret_cast<void *>(pointer));
    // Without a stream the memory is usable at once, from any stream, as
    // cuMemAlloc's is.
    if (!stream && !succeeded(function, *d, d->streamSynchronize(nullptr)))
      return nullptr;
  }
  return reinterpret_cast<void *>(pointer);
}

void mgpuMemFree(void *pointer, void *stream) {
  const char *function = "mgpuMemFree";
  if (!pointer)
    return;
  DeviceScope scope(function, /*release=*/true);
  const Driver *d = scope.get();
  if (!d)
    return;
  if (!DevicePools::take(pointer)) {
    released(function, *d, d->memFree(address(pointer)));
    return;
  }
  // Back to the pool once `stream` reaches the free; without a stream once
  // the device has finished what it was given, as cuMemFree waits.
  if (!stream) {
    if (Result result = d->ctxSynchronize()) {
      released(function, *d, result);
      return;
    }
  }
  released(function, *d, d->memFreeAsync(address(pointer), stream));
}

void attnresGpuReleaseCachedMemory(void) {
  const char *function = "attnresGpuReleaseCachedMemory";
  DeviceScope scope(function);
  const Driver *d = scope.get();
  if (!d)
    return;
  for (void *pool : DevicePools::all())
    succeeded(function, *d, d->memPoolTrimTo(pool, 0));
}

void mgpuMemcpy(void *destination, void *source, size_t sizeBytes,
                void *stream) {
  const char *function = "mgpuMemcpy";
  if (!sizeBytes)
    return;
  DeviceScope scope(function);
  if (!scope.get())
    return;
  if (!destination || !source) {
    report(function, "copying " + std::to_string(sizeBytes) +
                         " bytes from or to a null pointer (a failed "
                         "allocation?)");
    return;
  }
  const Driver &d = *scope.get();
  succeeded(function, d,
            d.hip ? d.hipMemcpyAsync(destination, source, sizeBytes,
                                     kHipMemcpyDefault, stream)
                  : d.memcpyAsync(address(destination), address(source),
                                  sizeBytes, stream));
}

void mgpuMemset32(void *destination, uint32_t value, size_t count,
                  void *stream) {
  fillDevice("mgpuMemset32", destination, count,
             [&](const Driver &d, unsigned long long to) {
               return d.memsetD32Async(to, value, count, stream);
             });
}

void mgpuMemset16(void *destination, uint16_t value, size_t count,
                  void *stream) {
  fillDevice("mgpuMemset16", destination, count,
             [&](const Driver &d, unsigned long long to) {
               return d.memsetD16Async(to, value, count, stream);
             });
}

void mgpuMemHostRegister(void *pointer, uint64_t sizeBytes) {
  const char *function = "mgpuMemHostRegister";
  if (!pointer || !sizeBytes)
    return;
  DeviceScope scope(function);
  if (scope.get())
    succeeded(function, *scope.get(),
              scope.get()->memHostRegister(pointer, sizeBytes, 0));
}

void mgpuMemHostUnregister(void *pointer) {
  const char *function = "mgpuMemHostUnregister";
  if (!pointer)
    return;
  DeviceScope scope(function);
  if (scope.get())
    succeeded(function, *scope.get(), scope.get()->memHostUnregister(pointer));
}

void mgpuMemHostRegisterMemRef(int64_t rank, void *descriptor,
                               int64_t elementBytes) {
  char *first = nullptr;
  if (size_t bytes = denseMemRef("mgpuMemHostRegisterMemRef", rank, descriptor,
                                 elementBytes, first))
    mgpuMemHostRegister(first, bytes);
}

void mgpuMemHostUnregisterMemRef(int64_t rank, void *descriptor,
                                 int64_t elementBytes) {
  char *first = nullptr;
  if (denseMemRef("mgpuMemHostUnregisterMemRef", rank, descriptor, elementBytes,
                  first))
    mgpuMemHostUnregister(first);
}

void mgpuSetDefaultDevice(int32_t device) {
  const char *function = "mgpuSetDefaultDevice";
  const Driver *d = usableDriver(function);
  if (!d)
    return;
  int count = 0;
  if (!succeeded(function, *d, d->deviceGetCount(&count)))
    return;
  if (device < 0 || device >= count) {
    report(function, "device " + std::to_string(device) +
                         " does not exist (this machine has " +
                         std::to_string(count) + " " + d->api() + " device" +
                         (count == 1 ? "" : "s") + ")");
    return;
  }
  defaultDevice = device;
}

} // extern "C"
