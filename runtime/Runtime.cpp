//===- Runtime.cpp - load bundles, launch attnres kernels -----------------===//
//
// No MLIR and no GPU SDK: the manifest is read with Json.h, and the CUDA
// driver (libcuda.so.1) or HIP (libamdhip64.so) is opened with dlopen when a
// bundle is loaded for a device. The launch rules are those of the manifest
// (docs/Bundle.md).
//
//===----------------------------------------------------------------------===//

#include "attnres-c/Runtime.h"

#include "DriverApi.h"
#include "EntryPoints.h"
#include "Json.h"

#include "attnres/Bundle/LaunchRules.h"
#include "attnres/Bundle/ManifestSchema.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

using attnres::json::member;
using attnres::json::text;
using attnres::json::Value;
namespace manifest = attnres::manifest;
using attnres::launch::kMaxClusterBlocks;

namespace {

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

struct Failure {
  AttnresStatus status;
  std::string message;
};

AttnresStatus report(const Failure &failure, char **error) {
  if (error)
    *error = strdup(failure.message.c_str());
  return failure.status;
}

#define ATTNRES_TRY(expression)                                                \
  do {                                                                         \
    Failure failure_ = (expression);                                           \
    if (failure_.status != ATTNRES_OK)                                         \
      return report(failure_, error);                                          \
  } while (false)

Failure ok() { return {ATTNRES_OK, ""}; }
Failure invalid(const std::string &message) {
  return {ATTNRES_ERROR_INVALID_ARGUMENT, message};
}

//===----------------------------------------------------------------------===//
// Drivers
//===----------------------------------------------------------------------===//

/// The CUDA driver or HIP (EntryPoints.h), and the library it came from.
struct Driver : attnres::driver::EntryPoints {
  void *library = nullptr;
};
using attnres::driver::Result;

using attnres::driver::kClusterLaunchDeviceAttribute;
using attnres::driver::LaunchAttribute;
using attnres::driver::LaunchConfig;

/// A launch of `block` threads a block over `grid` whose blocks along y form
/// clusters of grid[1].
LaunchConfig clusterLaunchConfig(const unsigned grid[3], unsigned block,
                                 void *stream, LaunchAttribute &cluster) {
  const unsigned threads[3] = {block, 1, 1}, shape[3] = {1, grid[1], 1};
  return attnres::driver::clusterLaunch(grid, threads, shape, 0, stream,
                                        cluster);
}

Failure openDriver(bool hip, Driver &driver) {
  const attnres::driver::Vendor &vendor =
      hip ? attnres::driver::kHip : attnres::driver::kCuda;
  std::string reason;
  driver.library = attnres::driver::openLibrary(vendor.libraries, reason);
  if (!driver.library)
    return {ATTNRES_ERROR_NO_DRIVER,
            attnres::driver::cannotLoad(vendor, reason, "this bundle")};
  if (!attnres::driver::bindEntryPoints(driver.library, vendor, driver))
    return {ATTNRES_ERROR_NO_DRIVER,
            attnres::driver::lacksEntryPoint(vendor, "the runtime")};
  if (Result result = driver.init(0))
    return {ATTNRES_ERROR_DRIVER,
            "initializing the driver: " + driver.describe(result)};
  return ok();
}

//===----------------------------------------------------------------------===//
// The manifest
//===----------------------------------------------------------------------===//

// The descriptions are the compiler's own (attnres/Bundle/ManifestSchema.h).
// An argument's alignment of 0 (manifests from before 2026-12-01) is derived
// from its shape (legacyAlignment).
using Argument = attnres::manifest::ArgumentDescription;
using GridDim = attnres::manifest::GridRule;

struct Kernel : attnres::manifest::KernelDescription {
  void *function = nullptr;
  /// Blocks a multiprocessor holds at once (the driver's occupancy
  /// calculator; 0 when unknown).
  int64_t residentBlocks = 0;
  /// Of a clusterY kernel: how many clusters of p blocks of it the device
  /// holds at once (index p, up to kMaxClusterBlocks; 0 when unknown).
  int clusterCapacity[kMaxClusterBlocks + 1] = {};
};

struct Op {
  std::string kind;
  Value facts;
  std::string description;
  std::map<std::string, std::string> kernels; // role -> kernel name

  /// A fact parseManifest checked to be a whole number in range (those of
  /// manifest::kOpFacts), else `fallback`.
  int64_t integer(const char *key, int64_t fallback = 0) const;
  bool flag(const char *key) const {
    const Value *value = member(facts, key);
    return value && value->is_boolean() && value->get<bool>();
  }
  std::string text(const char *key) const {
    return attnres::json::text(member(facts, key));
  }
  bool has(const char *key) const { return member(facts, key) != nullptr; }
};

int64_t elementBytes(const std::string &type) {
  if (type == "f32" || type == "i32")
    return 4;
  if (type == "bf16" || type == "f16")
    return 2;
  if (type == "f64" || type == "i64")
    return 8;
  return 1;
}

using attnres::launch::ceilDiv;

} // namespace

struct AttnresRuntime {
  Value manifest;
  /// The manifest's rules.launch (every field read from it).
  attnres::launch::Rules rules;
  std::vector<Op> ops;
  std::map<std::string, Kernel> kernels;
  std::string vendor;
  int multiprocessors = 0;
  /// The device launches thread-block clusters (NVIDIA sm_90 and later,
  /// with a driver that has cuLaunchKernelEx).
  bool clusterLaunch = false;
  Driver driver;
  void *module = nullptr;
  /// CUDA: the context the module was loaded into.
  void *context = nullptr;
  bool loaded = false;

  ~AttnresRuntime() {
    if (module && driver.moduleUnload)
      driver.moduleUnload(module);
    // The driver library stays open: unloading it under a live context is
    // not safe.
  }
};

namespace {

constexpr off_t kMaxManifestBytes = manifest::kMaxManifestBytes;
constexpr off_t kMaxBinaryBytes = manifest::kMaxBinaryBytes;

/// Checks that `name` is a plain file name (no path).
Failure checkFileName(const std::string &name) {
  if (name.empty() || name == "." || name == ".." ||
      name.find_first_of(std::string("/\\\0", 3)) != std::string::npos)
    return {ATTNRES_ERROR_BUNDLE,
            "a bundle names files inside its own folder by a plain file "
            "name; got '" +
                name.substr(0, 200) + "'"};
  return ok();
}

/// Checks that a bundle's `what` of `bytes` bytes is within its cap.
Failure checkSize(const char *what, size_t bytes, off_t maxBytes) {
  if (bytes <= static_cast<size_t>(maxBytes))
    return ok();
  return {ATTNRES_ERROR_BUNDLE, std::string("the ") + what + " is " +
                                    std::to_string(bytes) + " bytes; a " +
                                    "bundle's " + what + " may be at most " +
                                    std::to_string(maxBytes) + " bytes"};
}

/// Reads `name`, a file of the bundle folder `directory`: a plain file name
/// (no path), a regular file (not a FIFO, a device or a folder), inside the
/// folder once links are resolved, and at most `maxBytes` long. Opening
/// does not block (a FIFO is refused, not waited on).
Failure readBundleFile(const std::string &directory, const std::string &name,
                       off_t maxBytes, std::string &contents) {
  if (Failure failure = checkFileName(name); failure.status != ATTNRES_OK)
    return failure;
  std::string path = directory + "/" + name;
  char folderPath[PATH_MAX], filePath[PATH_MAX];
  if (!realpath(path.c_str(), filePath) ||
      !realpath(directory.c_str(), folderPath))
    return {ATTNRES_ERROR_BUNDLE,
            "cannot read '" + path + "': " + std::strerror(errno)};
  std::string folder(folderPath), file(filePath);
  if (file.compare(0, folder.size() + 1, folder + "/") != 0)
    return {ATTNRES_ERROR_BUNDLE, "'" + path + "' resolves to '" + file +
                                      "', outside the bundle folder '" +
                                      folder + "'"};
  int fd = open(filePath, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return {ATTNRES_ERROR_BUNDLE,
            "cannot read '" + path + "': " + std::strerror(errno)};
  struct stat info;
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    close(fd);
    return {ATTNRES_ERROR_BUNDLE,
            "'" + path +
                "' is not a regular file (a bundle holds only "
                "regular files)"};
  }
  if (info.st_size > maxBytes) {
    close(fd);
    return {ATTNRES_ERROR_BUNDLE,
            "'" + path + "' is " + std::to_string(info.st_size) +
                " bytes; a bundle's " + name + " may be at most " +
                std::to_string(maxBytes) + " bytes"};
  }
  // Reads what fstat reported; a file that grows meanwhile is cut there.
  contents.assign(static_cast<size_t>(info.st_size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t got = read(fd, &contents[done], contents.size() - done);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0) {
      close(fd);
      return {ATTNRES_ERROR_BUNDLE,
              "cannot read '" + path + "': " +
                  (got < 0 ? std::strerror(errno) : "it shrank while read")};
    }
    done += static_cast<size_t>(got);
  }
  close(fd);
  return ok();
}

Failure bundleError(const std::string &message) {
  return {ATTNRES_ERROR_BUNDLE, "malformed bundle manifest: " + message};
}

/// `value` as a whole number in [min, max]: a fraction, a number past the
/// range (in any spelling: 1e18, 18446744073709551616) or a string is
/// refused, never cast.
bool wholeNumber(const Value *value, int64_t min, int64_t max, int64_t &out) {
  if (!value || !value->is_number())
    return false;
  if (value->is_number_unsigned()) {
    uint64_t number = value->get<uint64_t>();
    if (number > static_cast<uint64_t>(max) ||
        static_cast<int64_t>(number) < min)
      return false;
    out = static_cast<int64_t>(number);
    return true;
  }
  if (value->is_number_integer()) {
    int64_t number = value->get<int64_t>();
    if (number < min || number > max)
      return false;
    out = number;
    return true;
  }
  double number = value->get<double>();
  // (2^63 and beyond do not fit, whatever `max`.)
  if (!std::isfinite(number) || number != std::floor(number) ||
      std::fabs(number) >= 9.2e18 || number < static_cast<double>(min) ||
      number > static_cast<double>(max))
    return false;
  out = static_cast<int64_t>(number);
  return true;
}

int64_t Op::integer(const char *key, int64_t fallback) const {
  int64_t value;
  return wholeNumber(member(facts, key), INT64_MIN, INT64_MAX, value)
             ? value
             : fallback;
}

bool wholeNumber(const Value *value, const manifest::NumberField &field,
                 int64_t &out) {
  return wholeNumber(value, field.min, field.max, out);
}

std::string rangeText(const manifest::NumberField &field) {
  auto bound = [](int64_t value) {
    for (int power = 20; power < 63; ++power)
      if (value == (int64_t(1) << power))
        return "2^" + std::to_string(power);
    return std::to_string(value);
  };
  return "[" + bound(field.min) + ", " + bound(field.max) + "]";
}

/// The alignment of an argument of a manifest that does not state it (from
/// before 2026-12-01), from what those compilers did: row buffers ("[.., D]")
/// read and written with vectors, a residual row ("[.., D/2]" bytes) with
/// half vectors, tables with 8-byte loads, the rest element by element.
int64_t legacyAlignment(const Kernel &kernel, const Argument &argument) {
  auto endsWith = [&](const std::string &suffix) {
    return argument.shape.size() >= suffix.size() &&
           argument.shape.compare(argument.shape.size() - suffix.size(),
                                  suffix.size(), suffix) == 0;
  };
  int64_t vectorBytes = kernel.vectorWidth * elementBytes(argument.type);
  return argument.kind == "table" ? 8
         : endsWith("D]")         ? vectorBytes
         : endsWith("D/2]")       ? std::max<int64_t>(1, vectorBytes / 2)
                                  : elementBytes(argument.type);
}

/// A name from the manifest, for a message: cut short, as a hostile
/// manifest may hold anything there.
std::string shortText(const std::string &text) {
  return text.size() > 64 ? text.substr(0, 64) + "..." : text;
}

/// Reads the kernel descriptions of the manifest into `runtime`: each a
/// known role, one to kMaxKernelArguments arguments of known kinds and
/// types, named once, a grid of known symbols. What a role's kernel may take
/// is checked with the op that launches it (checkRole).
Failure parseKernels(const Value &kernels, AttnresRuntime &runtime) {
  if (!kernels.is_array())
    return bundleError("no kernels array");
  if (kernels.size() > static_cast<size_t>(manifest::kMaxKernels))
    return bundleError("kernels has " + std::to_string(kernels.size()) +
                       " entries; a bundle holds at most " +
                       std::to_string(manifest::kMaxKernels));
  for (const Value &entry : kernels) {
    Kernel kernel;
    const Value *name = member(entry, "name"), *role = member(entry, "role");
    const Value *arguments = member(entry, "arguments"),
                *grid = member(entry, "grid");
    const Value *block = member(entry, manifest::kKernelBlock.key);
    if (!name || !role || !arguments || !grid || !block ||
        !arguments->is_array() || !grid->is_array() || grid->size() != 3)
      return bundleError("a kernel lacks name, role, arguments, grid or block");
    kernel.name = text(name);
    kernel.role = text(role);
    std::string named = "kernel " + shortText(kernel.name);
    if (kernel.name.empty())
      return bundleError("a kernel's name must be a non-empty string");
    if (runtime.kernels.count(kernel.name))
      return bundleError(named + " is described twice");
    if (!manifest::listed(manifest::kRoles, kernel.role))
      return bundleError(named + ": role '" + shortText(kernel.role) +
                         "' is not one of " + manifest::kRoles);
    if (!wholeNumber(block, manifest::kKernelBlock, kernel.block))
      return bundleError(named + ": block must be a whole number in " +
                         rangeText(manifest::kKernelBlock));
    if (const Value *cluster = member(entry, manifest::kKernelClusterY)) {
      if (!cluster->is_boolean())
        return bundleError(named + ": " + manifest::kKernelClusterY +
                           " must be true or false");
      kernel.clusterY = cluster->get<bool>();
    }
    if (const Value *width = member(entry, manifest::kKernelVectorWidth.key);
        width &&
        !wholeNumber(width, manifest::kKernelVectorWidth, kernel.vectorWidth))
      return bundleError(named + ": vector_width must be a whole number in " +
                         rangeText(manifest::kKernelVectorWidth));
    if (arguments->empty() ||
        arguments->size() > static_cast<size_t>(manifest::kMaxKernelArguments))
      return bundleError(named + ": arguments must hold 1 to " +
                         std::to_string(manifest::kMaxKernelArguments) +
                         " entries, got " + std::to_string(arguments->size()));
    for (const Value &argument : *arguments) {
      Argument parsed;
      for (auto [key, field] :
           {std::pair{"name", &parsed.name}, std::pair{"kind", &parsed.kind},
            std::pair{"type", &parsed.type}, std::pair{"shape", &parsed.shape}})
        *field = text(member(argument, key));
      if (parsed.name.empty() || parsed.kind.empty())
        return bundleError(named + " has an argument without name or kind");
      if (!manifest::listed(manifest::kArgumentKinds, parsed.kind))
        return bundleError(named + ": argument '" + shortText(parsed.name) +
                           "' has kind '" + shortText(parsed.kind) +
                           "'; kinds are " + manifest::kArgumentKinds);
      for (const Argument &earlier : kernel.arguments)
        if (earlier.name == parsed.name)
          return bundleError(named + ": argument '" + shortText(parsed.name) +
                             "' is given twice");
      if (const Value *alignment =
              member(argument, manifest::kArgumentAlignment.key);
          alignment && (!wholeNumber(alignment, manifest::kArgumentAlignment,
                                     parsed.alignment) ||
                        !manifest::isPowerOfTwo(parsed.alignment)))
        return bundleError(named + ": argument " + shortText(parsed.name) +
                           " has an alignment that is not a power of two in " +
                           rangeText(manifest::kArgumentAlignment));
      kernel.arguments.push_back(parsed);
    }
    for (int dim = 0; dim < 3; ++dim) {
      const Value &g = (*grid)[dim];
      const Value *symbol = member(g, "symbol");
      GridDim &rule = kernel.grid[dim];
      if (!symbol || !symbol->is_string() ||
          !wholeNumber(member(g, manifest::kGridScale.key),
                       manifest::kGridScale, rule.scale) ||
          !wholeNumber(member(g, manifest::kGridDivisor.key),
                       manifest::kGridDivisor, rule.divisor))
        return bundleError(named +
                           " has a bad grid rule (a symbol, and scale and "
                           "divisor whole numbers in " +
                           rangeText(manifest::kGridScale) + ")");
      rule.symbol = text(symbol);
      if (!manifest::listed(manifest::kGridSymbols, rule.symbol))
        return bundleError(named + ": grid symbol '" + shortText(rule.symbol) +
                           "' is not one of " + manifest::kGridSymbols);
    }
    runtime.kernels[kernel.name] = std::move(kernel);
  }
  return ok();
}

/// Checks that the kernel `op` names for `role` exists, has that role, and
/// takes only arguments and grid symbols the runtime supplies to it.
Failure checkRole(const AttnresRuntime &runtime, const std::string &named,
                  const manifest::KernelRole &role, Op &op) {
  const Value *fact = member(op.facts, role.role);
  if (!fact) {
    if (role.required)
      return bundleError(named + " names no " + role.role + " kernel");
    return ok();
  }
  const std::string &name = text(fact);
  if (name.empty())
    return bundleError(named + ": " + role.role +
                       " must name a kernel (a non-empty string)");
  auto found = runtime.kernels.find(name);
  if (found == runtime.kernels.end())
    return bundleError(named + " names kernel '" + shortText(name) +
                       "' as its " + role.role + ", which the bundle lacks");
  const Kernel &kernel = found->second;
  if (kernel.role != role.role)
    return bundleError(named + " names kernel " + shortText(name) + " as its " +
                       role.role + ", but the kernel's role is " + kernel.role);
  for (const Argument &argument : kernel.arguments)
    if (std::string problem = manifest::argumentProblem(role, argument);
        !problem.empty())
      return bundleError("kernel " + shortText(name) + ": " + problem);
  for (const GridDim &dim : kernel.grid)
    if (std::string problem = manifest::gridProblem(role, dim.symbol);
        !problem.empty())
      return bundleError("kernel " + shortText(name) + ": " + problem);
  op.kernels[role.role] = name;
  return ok();
}

/// Reads the op entries of the manifest into `runtime`: each of a known
/// kind, with the facts the runtime computes with for it (whole numbers in
/// range, element types it knows) and the kernels it launches.
Failure parseOps(const Value &ops, AttnresRuntime &runtime) {
  if (!ops.is_array())
    return bundleError("no ops array");
  if (ops.size() > static_cast<size_t>(manifest::kMaxOps))
    return bundleError("ops has " + std::to_string(ops.size()) +
                       " entries; a bundle holds at most " +
                       std::to_string(manifest::kMaxOps));
  for (const Value &entry : ops) {
    std::string named = "op " + std::to_string(runtime.ops.size());
    if (!entry.is_object())
      return bundleError(named + " is not an object");
    Op op;
    op.facts = entry;
    op.kind = op.text("op");
    const manifest::OpKind *kind = manifest::findOpKind(op.kind);
    if (!kind) {
      std::string kinds;
      for (const manifest::OpKind &known : manifest::kOpKinds)
        kinds += std::string(kinds.empty() ? "" : ", ") + known.kind;
      return bundleError(named + ": op must be one of " + kinds + "; got '" +
                         shortText(op.kind) + "'");
    }
    named += " (" + op.kind + ")";
    for (const manifest::NumberField &fact : manifest::kOpFacts) {
      int64_t value;
      const Value *number = member(entry, fact.key);
      if (number && !wholeNumber(number, fact, value))
        return bundleError("op fact " + std::string(fact.key) +
                           " must be a whole number in " + rangeText(fact));
    }
    for (const manifest::NumberField &fact : manifest::kOpFacts)
      if (!member(entry, fact.key) && manifest::listed(kind->numbers, fact.key))
        return bundleError(named + " lacks " + fact.key + ", a whole number " +
                           "in " + rangeText(fact));
    for (const char *key : {"value_type", manifest::kOutputNormType}) {
      const Value *type = member(entry, key);
      bool required = manifest::listed(kind->types, key);
      if ((type || required) &&
          !manifest::listed(manifest::kValueTypes, text(type)))
        return bundleError(named + ": " + key + " must be one of " +
                           manifest::kValueTypes);
    }
    if (const Value *perQuery = member(entry, manifest::kOutputNormPerQuery);
        perQuery && !perQuery->is_boolean())
      return bundleError(named + ": " + manifest::kOutputNormPerQuery +
                         " must be true or false");
    for (const manifest::KernelRole &role : manifest::kKernelRoles)
      if (op.kind == role.opKind)
        if (Failure failure = checkRole(runtime, named, role, op);
            failure.status != ATTNRES_OK)
          return failure;
    op.description = attnres::json::print(entry);
    runtime.ops.push_back(std::move(op));
  }
  return ok();
}

/// Reads the manifest into `runtime` (no driver involved).
Failure parseManifest(const std::string &contents, AttnresRuntime &runtime) {
  std::string error;
  if (!attnres::json::parse(contents, runtime.manifest, error))
    return bundleError(error);
  const Value &root = runtime.manifest;
  if (const Value *version = member(root, manifest::kFormatVersionKey);
      !version || !version->is_number() || *version != manifest::kFormatVersion)
    return bundleError(std::string(manifest::kFormatVersionKey) + " " +
                       std::to_string(manifest::kFormatVersion) + " expected");
  const Value *target = member(root, manifest::kTarget);
  const std::string &vendor =
      text(target ? member(*target, manifest::kVendor) : nullptr);
  if (vendor != "nvidia" && vendor != "amd")
    return bundleError("target.vendor must be nvidia or amd");
  runtime.vendor = vendor;

  const Value *kernels = member(root, manifest::kKernels);
  if (!kernels)
    return bundleError("no kernels array");
  if (Failure failure = parseKernels(*kernels, runtime);
      failure.status != ATTNRES_OK)
    return failure;
  const Value *ops = member(root, manifest::kOps);
  if (!ops)
    return bundleError("no ops array");
  if (Failure failure = parseOps(*ops, runtime); failure.status != ATTNRES_OK)
    return failure;

  const Value *rules = member(root, manifest::kRules);
  const Value *launch = rules ? member(*rules, manifest::kLaunch) : nullptr;
  int64_t *fields[] = {&runtime.rules.blocksPerMultiprocessor,
                       &runtime.rules.sourcesPerPartition,
                       &runtime.rules.partitionBytes,
                       &runtime.rules.tokensPerBlock};
  static_assert(std::size(fields) == std::size(manifest::kLaunchRules));
  for (size_t i = 0; i < std::size(fields); ++i) {
    const manifest::NumberField &rule = manifest::kLaunchRules[i];
    const Value *value = launch ? member(*launch, rule.key) : nullptr;
    if (!wholeNumber(value, rule, *fields[i]))
      return bundleError(std::string("rules.launch.") + rule.key +
                         " must be a whole number in " + rangeText(rule));
  }
  return ok();
}

Failure loadModule(AttnresRuntime &runtime, const std::string &binary) {
  Driver &driver = runtime.driver;
  if (Failure failure = openDriver(runtime.vendor == "amd", driver);
      failure.status != ATTNRES_OK)
    return failure;
  int device = 0;
  if (driver.hip) {
    if (Result result = driver.getDevice(&device))
      return {ATTNRES_ERROR_DRIVER, driver.describe(result)};
  } else {
    void *context = nullptr;
    driver.ctxGetCurrent(&context);
    if (!context) {
      if (Result result = driver.deviceGet(&device, 0))
        return {ATTNRES_ERROR_DRIVER,
                "no CUDA device: " + driver.describe(result)};
      if (Result result = driver.primaryCtxRetain(&context, device))
        return {ATTNRES_ERROR_DRIVER, driver.describe(result)};
      driver.ctxSetCurrent(context);
    } else if (Result result = driver.ctxGetDevice(&device)) {
      return {ATTNRES_ERROR_DRIVER, driver.describe(result)};
    }
    runtime.context = context;
  }
  // ATTNRES_NO_CLUSTERS=1 (read at load) keeps the clustered forward out,
  // for comparisons: the partial kernel and the merge run instead.
  int clusterLaunch = 0;
  const char *noClusters = std::getenv("ATTNRES_NO_CLUSTERS");
  if (!driver.hip && driver.launchKernelEx &&
      !(noClusters && *noClusters && *noClusters != '0') &&
      !driver.deviceGetAttribute(&clusterLaunch, kClusterLaunchDeviceAttribute,
                                 device))
    runtime.clusterLaunch = clusterLaunch != 0;
  if (Result result = driver.moduleLoadData(&runtime.module, binary.data()))
    return {ATTNRES_ERROR_DRIVER,
            "loading the kernels: " + driver.describe(result)};
  for (auto &[name, kernel] : runtime.kernels) {
    if (Result result = driver.moduleGetFunction(&kernel.function,
                                                 runtime.module, name.c_str()))
      return {ATTNRES_ERROR_BUNDLE,
              "kernel '" + name +
                  "' is not in the binary: " + driver.describe(result)};
    int blocks = 0;
    if (driver.occupancy &&
        !driver.occupancy(&blocks, kernel.function,
                          static_cast<int>(kernel.block), 0))
      kernel.residentBlocks = blocks;
    if (kernel.clusterY && runtime.clusterLaunch &&
        driver.occupancyMaxActiveClusters)
      for (unsigned p = 2; p <= kMaxClusterBlocks; ++p) {
        LaunchAttribute attribute;
        unsigned grid[3] = {1, p, 1};
        LaunchConfig config = clusterLaunchConfig(
            grid, static_cast<unsigned>(kernel.block), nullptr, attribute);
        int clusters = 0;
        if (!driver.occupancyMaxActiveClusters(&clusters, kernel.function,
                                               &config))
          kernel.clusterCapacity[p] = clusters;
      }
  }
  int count = 0;
  driver.deviceGetAttribute(
      &count, attnres::driver::multiprocessorCountAttribute(driver.hip),
      device);
  if (const char *override = std::getenv("ATTNRES_NUM_MULTIPROCESSORS"))
    count = std::atoi(override);
  runtime.multiprocessors = count > 0 ? count : 1;
  runtime.loaded = true;
  return ok();
}

/// The file name of the one binary the manifest names.
Failure binaryFile(const AttnresRuntime &runtime, std::string &name) {
  const Value *binaries = member(runtime.manifest, manifest::kBinaries);
  const Value *file = binaries && binaries->is_array() && binaries->size() == 1
                          ? member((*binaries)[0], manifest::kFile)
                          : nullptr;
  if (!file || !file->is_string())
    return bundleError("exactly one binary expected");
  name = text(file);
  return checkFileName(name);
}

Failure loadBundle(const std::string &directory, AttnresRuntime &runtime,
                   bool withDevice) {
  std::string manifest;
  if (Failure failure = readBundleFile(directory, "manifest.json",
                                       kMaxManifestBytes, manifest);
      failure.status != ATTNRES_OK)
    return failure;
  if (Failure failure = parseManifest(manifest, runtime);
      failure.status != ATTNRES_OK)
    return failure;
  std::string file, binary;
  if (Failure failure = binaryFile(runtime, file); failure.status != ATTNRES_OK)
    return failure;
  if (Failure failure =
          readBundleFile(directory, file, kMaxBinaryBytes, binary);
      failure.status != ATTNRES_OK)
    return failure;
  if (binary.empty())
    return {ATTNRES_ERROR_BUNDLE, "the bundle's binary is empty"};
  if (withDevice)
    return loadModule(runtime, binary);
  // An inspected bundle has no device; its launch rules can still be asked
  // for a given multiprocessor count.
  if (const char *override = std::getenv("ATTNRES_NUM_MULTIPROCESSORS"))
    runtime.multiprocessors = std::atoi(override);
  return ok();
}

//===----------------------------------------------------------------------===//
// Launching
//===----------------------------------------------------------------------===//

/// The values of a launch, by argument name.
struct Values {
  std::map<std::string, const void *> pointers;
  std::map<std::string, int64_t> integers;
};

Failure checkOp(const AttnresRuntime *runtime, int op, const char *kind) {
  if (!runtime)
    return invalid("the runtime is null");
  if (op < 0 || op >= static_cast<int>(runtime->ops.size()))
    return invalid("op index " + std::to_string(op) +
                   " is out of range (the "
                   "bundle has " +
                   std::to_string(runtime->ops.size()) + " ops)");
  if (runtime->ops[op].kind != kind)
    return invalid("op " + std::to_string(op) + " is a " +
                   runtime->ops[op].kind + ", not a " + kind);
  return ok();
}

/// The kernel of `op` for `role`, which the manifest check guarantees for
/// the roles an op kind has.
Failure kernelFor(const Op &op, const char *role, std::string &name) {
  auto it = op.kernels.find(role);
  if (it == op.kernels.end())
    return bundleError("the " + op.kind + " op names no " + role + " kernel");
  name = it->second;
  return ok();
}

Failure launch(const AttnresRuntime &runtime, const std::string &name,
               const Values &values,
               const std::map<std::string, int64_t> &symbols, void *stream) {
  if (!runtime.loaded)
    return invalid("the bundle was inspected, not loaded for a device");
  const Kernel &kernel = runtime.kernels.find(name)->second;
  std::vector<int64_t> storage(kernel.arguments.size());
  std::vector<void *> parameters;
  for (size_t i = 0; i < kernel.arguments.size(); ++i) {
    const Argument &argument = kernel.arguments[i];
    if (argument.kind == "i64") {
      auto it = values.integers.find(argument.name);
      if (it == values.integers.end())
        return invalid("kernel " + name + " needs '" + argument.name + "'");
      storage[i] = it->second;
    } else {
      auto it = values.pointers.find(argument.name);
      if (it == values.pointers.end() || !it->second)
        return invalid("'" + argument.name + "' is null, but " + name +
                       " reads or writes it (" + argument.shape + ")");
      int64_t alignment = argument.alignment > 0
                              ? argument.alignment
                              : legacyAlignment(kernel, argument);
      if (reinterpret_cast<uintptr_t>(it->second) % alignment != 0)
        return invalid("'" + argument.name + "' must be aligned to " +
                       std::to_string(alignment) + " bytes for " + name);
      storage[i] = static_cast<int64_t>(reinterpret_cast<intptr_t>(it->second));
    }
    parameters.push_back(&storage[i]);
  }
  unsigned grid[3];
  for (int dim = 0; dim < 3; ++dim) {
    const GridDim &g = kernel.grid[dim];
    int64_t symbol = 1;
    if (g.symbol != "1") {
      auto it = symbols.find(g.symbol);
      if (it == symbols.end())
        return invalid("no value for grid symbol " + g.symbol + " of " + name);
      symbol = it->second;
    }
    // The symbols are counts of the call (>= 0); the rule's scale and
    // divisor are in [1, 2^20].
    int64_t scaled;
    if (symbol < 0)
      return invalid("grid of " + name + ": " + g.symbol + " = " +
                     std::to_string(symbol) + " is not a count");
    if (__builtin_mul_overflow(symbol, g.scale, &scaled))
      return invalid("grid of " + name + " too large: " + g.symbol + " = " +
                     std::to_string(symbol));
    int64_t size = ceilDiv(scaled, g.divisor);
    if (size == 0)
      return ok(); // nothing to do
    if (size > attnres::driver::kMaxGrid[dim])
      return invalid("grid of " + name + " too large: " + g.symbol + " = " +
                     std::to_string(symbol) + " needs " + std::to_string(size) +
                     " blocks along dimension " + std::to_string(dim) +
                     ", more than " +
                     std::to_string(attnres::driver::kMaxGrid[dim]));
    grid[dim] = static_cast<unsigned>(size);
  }
  const Driver &driver = runtime.driver;
  // A thread that never touched the GPU (a framework's worker thread) has
  // no current context; the module's is the one its kernels run in.
  if (!driver.hip) {
    void *current = nullptr;
    driver.ctxGetCurrent(&current);
    if (!current)
      driver.ctxSetCurrent(runtime.context);
  }
  Result result;
  if (kernel.clusterY) {
    // Only the runtime's own choice launches the clustered forward; a
    // manifest that gives another role clusters is refused here.
    if (!runtime.clusterLaunch)
      return invalid("kernel " + name +
                     " needs thread-block clusters, which this device or "
                     "driver does not launch (NVIDIA sm_90 and later)");
    if (grid[1] > kMaxClusterBlocks)
      return invalid("kernel " + name + " would form clusters of " +
                     std::to_string(grid[1]) + " blocks, more than " +
                     std::to_string(kMaxClusterBlocks));
    LaunchAttribute attribute;
    LaunchConfig config = clusterLaunchConfig(
        grid, static_cast<unsigned>(kernel.block), stream, attribute);
    result = driver.launchKernelEx(&config, kernel.function, parameters.data(),
                                   nullptr);
  } else {
    result = driver.launchKernel(kernel.function, grid[0], grid[1], grid[2],
                                 static_cast<unsigned>(kernel.block), 1, 1, 0,
                                 stream, parameters.data(), nullptr);
  }
  if (result)
    return {ATTNRES_ERROR_DRIVER,
            "launching " + name + ": " + driver.describe(result)};
  return ok();
}

/// A partition count for L sources: every partition gets a source.
Failure checkPartitions(int64_t partitions, int64_t numSources) {
  if (partitions < 1 || partitions > numSources)
    return invalid(
        "partitions must be in [1, L = " + std::to_string(numSources) +
        "], got " + std::to_string(partitions));
  return ok();
}

/// Blocks of `kernel` the whole device holds at once: the driver's
/// occupancy for a loaded bundle, else the manifest's
/// blocks_per_multiprocessor; ATTNRES_BLOCKS_PER_MULTIPROCESSOR overrides
/// both (for experiments).
int64_t residentBlocks(const AttnresRuntime &runtime, const Op &op,
                       const char *role) {
  int64_t perMultiprocessor = runtime.rules.blocksPerMultiprocessor;
  auto name = op.kernels.find(role);
  if (name != op.kernels.end()) {
    auto kernel = runtime.kernels.find(name->second);
    if (kernel != runtime.kernels.end() && kernel->second.residentBlocks > 0)
      perMultiprocessor = kernel->second.residentBlocks;
  }
  if (const char *override = std::getenv("ATTNRES_BLOCKS_PER_MULTIPROCESSOR"))
    if (int64_t value = std::atoll(override); value > 0)
      perMultiprocessor = value;
  // Saturated: the rules only compare the count with block counts.
  int64_t resident;
  if (__builtin_mul_overflow(perMultiprocessor,
                             int64_t(std::max(1, runtime.multiprocessors)),
                             &resident))
    return INT64_MAX;
  return resident;
}

/// The clustered forward kernel of `op` where the runtime may use it (a
/// loaded bundle that has one, on a device that launches clusters), else
/// null.
const Kernel *clusterKernel(const AttnresRuntime &runtime, const Op &op) {
  auto name = op.kernels.find("forward_cluster");
  if (name == op.kernels.end() || !runtime.loaded || !runtime.clusterLaunch)
    return nullptr;
  return &runtime.kernels.find(name->second)->second;
}

/// Whether the forward over `partitions` partitions of `tokens` tokens runs
/// as one clustered kernel rather than the partial kernel and the merge: it
/// does where the device holds all of its clusters (one a block of
/// rows_per_block tokens) at once. A second wave of clusters would double
/// the time: on the H200 15 clusters of 8 blocks of 256 threads fit, not 16.
bool clusteredForward(const AttnresRuntime &runtime, const Op &op,
                      int64_t tokens, int64_t partitions) {
  const Kernel *kernel = clusterKernel(runtime, op);
  return kernel && partitions >= 2 && partitions <= kMaxClusterBlocks &&
         ceilDiv(tokens, op.integer("rows_per_block", 1)) <=
             kernel->clusterCapacity[partitions];
}

int64_t forwardPartitions(const AttnresRuntime &runtime, const Op &op,
                          int64_t tokens) {
  int64_t L = op.integer("num_sources"), D = op.integer("width");
  int64_t G = op.integer("rows_per_block", 1);
  int64_t bytes = elementBytes(op.text("value_type"));
  int64_t resident = residentBlocks(runtime, op, "forward_partial");
  int64_t tokenBlocks = ceilDiv(tokens, G);
  int64_t partitions = attnres::launch::forwardPartitions(
      resident, tokenBlocks, L, L * D * bytes, runtime.rules);
  // The clustered forward with as many partitions as keep all its clusters
  // resident, up to its own rule's count where that is more (rows too short
  // for the partial kernel's merge); the partial kernel and the merge where
  // no cluster fits.
  int64_t clustered = partitions;
  if (clusterKernel(runtime, op))
    clustered =
        std::max(clustered, attnres::launch::clusteredForwardPartitions(
                                resident, tokenBlocks, L, runtime.rules));
  for (int64_t p = std::min(clustered, kMaxClusterBlocks); p >= 2; --p)
    if (clusteredForward(runtime, op, tokens, p))
      return p;
  return partitions;
}

int64_t backwardBlocks(const AttnresRuntime &runtime, const Op &op,
                       int64_t tokens) {
  int64_t G = op.integer("rows_per_block", 1);
  return attnres::launch::backwardBlocks(
      residentBlocks(runtime, op, "backward"), tokens,
      G * runtime.rules.tokensPerBlock);
}

int64_t backwardPartitions(const AttnresRuntime &runtime, const Op &op,
                           int64_t blocks) {
  return attnres::launch::backwardPartitions(
      residentBlocks(runtime, op, "backward"), blocks,
      op.integer("num_sources"), runtime.rules);
}

using attnres::launch::CheckedIntegers;

/// Where the split forward's partial results lie in its workspace, over
/// `partitions` partitions of `tokens` tokens; refused, naming both, where
/// its size does not fit in 64 bits.
Failure splitForwardLayout(
    const Op &op, int64_t tokens, int64_t partitions,
    attnres::launch::ForwardWorkspace<attnres::launch::Integers> &layout) {
  CheckedIntegers a;
  auto rows = a.mul(
      a.mul(a.constant(partitions), a.constant(op.integer("num_queries", 1))),
      a.constant(tokens));
  auto sized = attnres::launch::forwardWorkspace(a, rows, op.integer("width"));
  if (sized.bytes.overflowed)
    return invalid("num_tokens = " + std::to_string(tokens) +
                   " with partitions = " + std::to_string(partitions) +
                   ": the split forward's workspace (P * M * N rows of D "
                   "floats) does not fit in 64 bits");
  layout = {sized.lseOffset.value, sized.bytes.value};
  return ok();
}

/// The bytes of the forward's workspace: none for one partition or the
/// clustered forward, else the split forward's.
Failure forwardWorkspace(const AttnresRuntime &runtime, const Op &op,
                         int64_t tokens, int64_t partitions, size_t &bytes) {
  bytes = 0;
  if (partitions <= 1 || clusteredForward(runtime, op, tokens, partitions))
    return ok();
  attnres::launch::ForwardWorkspace<attnres::launch::Integers> layout;
  if (Failure failure = splitForwardLayout(op, tokens, partitions, layout);
      failure.status != ATTNRES_OK)
    return failure;
  bytes = static_cast<size_t>(layout.bytes);
  return ok();
}

/// The backward's partial rows and workspace layout (LaunchRules.h, which
/// keep-host's host code computes too): partial_rows_per_block for every
/// block of every source partition (bundles from before that fact wrote one
/// per row group); refused, naming the counts, where the workspace's size
/// does not fit in 64 bits.
struct BackwardLayout {
  int64_t partialRows = 0;
  attnres::launch::BackwardWorkspace<attnres::launch::Integers> workspace;
};
Failure backwardLayout(const Op &op, int64_t tokens, int64_t blocks,
                       int64_t partitions, BackwardLayout &layout) {
  CheckedIntegers a;
  int64_t M = op.integer("num_queries", 1), D = op.integer("width");
  int64_t R = op.integer("rank");
  int64_t weightRows = op.flag("output_norm_per_query") ? M : 1;
  auto rows = a.mul(a.mul(a.constant(partitions), a.constant(blocks)),
                    a.constant(op.integer("partial_rows_per_block",
                                          op.integer("rows_per_block", 1))));
  auto sized = attnres::launch::backwardWorkspace(
      a, rows, M * R, op.has("output_norm_type") ? weightRows * D : 0);
  if (sized.bytes.overflowed)
    return invalid("blocks = " + std::to_string(blocks) +
                   " with partitions = " + std::to_string(partitions) +
                   " (num_tokens = " + std::to_string(tokens) +
                   "): the backward's workspace (P * B partial rows of M * R "
                   "floats) does not fit in 64 bits");
  layout.partialRows = rows.value;
  layout.workspace = {sized.dhOffset.value, sized.bytes.value};
  return ok();
}

} // namespace

//===----------------------------------------------------------------------===//
// The C API
//===----------------------------------------------------------------------===//

extern "C" {

void attnresFreeString(char *string) { std::free(string); }

AttnresStatus attnresRuntimeLoad(const char *directory, AttnresRuntime **out,
                                 char **error) {
  if (!directory || !out)
    return report(invalid("directory and out must not be null"), error);
  auto runtime = std::make_unique<AttnresRuntime>();
  ATTNRES_TRY(loadBundle(directory, *runtime, /*withDevice=*/true));
  *out = runtime.release();
  return ATTNRES_OK;
}

AttnresStatus attnresRuntimeInspect(const char *directory, AttnresRuntime **out,
                                    char **error) {
  if (!directory || !out)
    return report(invalid("directory and out must not be null"), error);
  auto runtime = std::make_unique<AttnresRuntime>();
  ATTNRES_TRY(loadBundle(directory, *runtime, /*withDevice=*/false));
  *out = runtime.release();
  return ATTNRES_OK;
}

AttnresStatus attnresRuntimeLoadFromMemory(const char *manifest,
                                           size_t manifestSize,
                                           const void *binary,
                                           size_t binarySize,
                                           AttnresRuntime **out, char **error) {
  if (!manifest || !binary || !binarySize || !out)
    return report(invalid("manifest, binary and out must not be null"), error);
  // The folder loaders' limits and checks, before anything is copied.
  ATTNRES_TRY(checkSize("manifest", manifestSize, kMaxManifestBytes));
  ATTNRES_TRY(checkSize("binary", binarySize, kMaxBinaryBytes));
  auto runtime = std::make_unique<AttnresRuntime>();
  ATTNRES_TRY(parseManifest(std::string(manifest, manifestSize), *runtime));
  std::string file;
  ATTNRES_TRY(binaryFile(*runtime, file));
  ATTNRES_TRY(loadModule(
      *runtime, std::string(static_cast<const char *>(binary), binarySize)));
  *out = runtime.release();
  return ATTNRES_OK;
}

void attnresRuntimeDestroy(AttnresRuntime *runtime) { delete runtime; }

int attnresRuntimeNumOps(const AttnresRuntime *runtime) {
  return runtime ? static_cast<int>(runtime->ops.size()) : 0;
}

const char *attnresRuntimeOpKind(const AttnresRuntime *runtime, int op) {
  if (!runtime || op < 0 || op >= static_cast<int>(runtime->ops.size()))
    return nullptr;
  return runtime->ops[op].kind.c_str();
}

const char *attnresRuntimeOpDescription(const AttnresRuntime *runtime, int op) {
  if (!runtime || op < 0 || op >= static_cast<int>(runtime->ops.size()))
    return nullptr;
  return runtime->ops[op].description.c_str();
}

int attnresRuntimeMultiprocessors(const AttnresRuntime *runtime) {
  return runtime ? runtime->multiprocessors : 0;
}

int64_t attnresForwardPartitions(const AttnresRuntime *runtime, int op,
                                 int64_t numTokens) {
  if (checkOp(runtime, op, "forward").status != ATTNRES_OK || numTokens < 0)
    return 0;
  return forwardPartitions(*runtime, runtime->ops[op], numTokens);
}

AttnresStatus attnresForwardWorkspaceSize(const AttnresRuntime *runtime, int op,
                                          int64_t numTokens, int64_t partitions,
                                          size_t *size, char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "forward"));
  if (!size || numTokens < 0 || partitions < 0)
    return report(invalid("size must not be null; tokens and partitions "
                          "must be >= 0"),
                  error);
  const Op &entry = runtime->ops[op];
  if (!partitions)
    partitions = forwardPartitions(*runtime, entry, numTokens);
  ATTNRES_TRY(checkPartitions(partitions, entry.integer("num_sources")));
  ATTNRES_TRY(forwardWorkspace(*runtime, entry, numTokens, partitions, *size));
  return ATTNRES_OK;
}

AttnresStatus attnresForward(const AttnresRuntime *runtime, int op,
                             const AttnresForwardArgs *args, void *stream,
                             char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "forward"));
  if (!args)
    return report(invalid("args must not be null"), error);
  const Op &entry = runtime->ops[op];
  int64_t N = args->num_tokens, L = entry.integer("num_sources");
  int64_t M = entry.integer("num_queries", 1);
  if (N < 0)
    return report(invalid("num_tokens must be >= 0"), error);
  if (N == 0)
    return ATTNRES_OK;
  int64_t P = args->partitions ? args->partitions
                               : forwardPartitions(*runtime, entry, N);
  ATTNRES_TRY(checkPartitions(P, L));
  int64_t rows;
  if (__builtin_mul_overflow(M, N, &rows))
    return report(invalid("num_tokens = " + std::to_string(N) +
                          ": its M * N rows do not fit in 64 bits"),
                  error);
  Values values;
  values.pointers = {{"sources", args->sources},
                     {"query", args->query},
                     {"key_norm", args->key_norm},
                     {"output_norm", args->output_norm},
                     {"o", args->o},
                     {"lse", args->lse},
                     {"o_pre", args->o_pre},
                     {"o_pre_residual", args->o_pre_residual}};
  values.integers = {{"num_tokens", N},
                     {"num_partitions", P},
                     {"num_rows", rows},
                     {"rows_per_weight", N}};
  std::string forward, partial, merge;
  ATTNRES_TRY(kernelFor(entry, "forward", forward));
  ATTNRES_TRY(kernelFor(entry, "forward_partial", partial));
  ATTNRES_TRY(kernelFor(entry, "merge", merge));
  if (P == 1) {
    ATTNRES_TRY(launch(*runtime, forward, values, {{"N", N}}, stream));
    return ATTNRES_OK;
  }
  if (clusteredForward(*runtime, entry, N, P)) {
    ATTNRES_TRY(launch(*runtime, entry.kernels.at("forward_cluster"), values,
                       {{"N", N}, {"P", P}}, stream));
    return ATTNRES_OK;
  }
  attnres::launch::ForwardWorkspace<attnres::launch::Integers> layout;
  ATTNRES_TRY(splitForwardLayout(entry, N, P, layout));
  if (!args->workspace ||
      args->workspace_size < static_cast<size_t>(layout.bytes))
    return report(invalid("the split forward (P = " + std::to_string(P) +
                          ") needs a workspace of " +
                          std::to_string(layout.bytes) + " bytes"),
                  error);
  char *workspace = static_cast<char *>(args->workspace);
  values.pointers["partial_o"] = workspace;
  values.pointers["partial_lse"] = workspace + layout.lseOffset;
  ATTNRES_TRY(launch(*runtime, partial, values, {{"N", N}, {"P", P}}, stream));
  ATTNRES_TRY(launch(*runtime, merge, values, {{"rows", rows}}, stream));
  return ATTNRES_OK;
}

int64_t attnresBackwardBlocks(const AttnresRuntime *runtime, int op,
                              int64_t numTokens) {
  if (checkOp(runtime, op, "backward").status != ATTNRES_OK || numTokens < 0)
    return 0;
  return backwardBlocks(*runtime, runtime->ops[op], numTokens);
}

int64_t attnresBackwardPartitions(const AttnresRuntime *runtime, int op,
                                  int64_t blocks) {
  if (checkOp(runtime, op, "backward").status != ATTNRES_OK || blocks < 1)
    return 0;
  return backwardPartitions(*runtime, runtime->ops[op], blocks);
}

AttnresStatus attnresBackwardWorkspaceSize(const AttnresRuntime *runtime,
                                           int op, int64_t numTokens,
                                           int64_t blocks, int64_t partitions,
                                           size_t *size, char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "backward"));
  if (!size || numTokens < 0 || blocks < 0 || partitions < 0)
    return report(invalid("size must not be null; tokens, blocks and "
                          "partitions must be >= 0"),
                  error);
  const Op &entry = runtime->ops[op];
  if (!blocks)
    blocks = backwardBlocks(*runtime, entry, numTokens);
  if (!partitions)
    partitions = backwardPartitions(*runtime, entry, blocks);
  ATTNRES_TRY(checkPartitions(partitions, entry.integer("num_sources")));
  BackwardLayout layout;
  ATTNRES_TRY(backwardLayout(entry, numTokens, blocks, partitions, layout));
  *size = static_cast<size_t>(layout.workspace.bytes);
  return ATTNRES_OK;
}

AttnresStatus attnresBackward(const AttnresRuntime *runtime, int op,
                              const AttnresBackwardArgs *args, void *stream,
                              char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "backward"));
  if (!args)
    return report(invalid("args must not be null"), error);
  const Op &entry = runtime->ops[op];
  int64_t N = args->num_tokens, L = entry.integer("num_sources");
  if (N < 0)
    return report(invalid("num_tokens must be >= 0"), error);
  int64_t B = args->blocks ? args->blocks : backwardBlocks(*runtime, entry, N);
  if (B < 1)
    return report(invalid("blocks must be >= 1"), error);
  int64_t P = args->partitions ? args->partitions
                               : backwardPartitions(*runtime, entry, B);
  ATTNRES_TRY(checkPartitions(P, L));
  BackwardLayout layout;
  ATTNRES_TRY(backwardLayout(entry, N, B, P, layout));
  int64_t needed = layout.workspace.bytes;
  if (!args->workspace || args->workspace_size < static_cast<size_t>(needed))
    return report(invalid("the backward (B = " + std::to_string(B) + ", P = " +
                          std::to_string(P) + ") needs a workspace of " +
                          std::to_string(needed) + " bytes"),
                  error);
  char *workspace = static_cast<char *>(args->workspace);
  Values values;
  values.pointers = {{"sources", args->sources},
                     {"query", args->query},
                     {"key_norm", args->key_norm},
                     {"output_norm", args->output_norm},
                     {"grad", args->grad},
                     {"lse", args->lse},
                     {"saved", args->saved},
                     {"saved_residual", args->saved_residual},
                     {"grad_lse", args->grad_lse},
                     {"grad_sources", args->grad_sources},
                     {"dq", args->dq},
                     {"dg", args->dg},
                     {"dh", args->dh},
                     {"partial_da", workspace},
                     {"partial_dh", workspace + layout.workspace.dhOffset}};
  values.integers = {{"num_tokens", N},
                     {"num_blocks", B},
                     {"num_partitions", P},
                     {"num_partial_rows", layout.partialRows}};
  std::string backward, finalize;
  ATTNRES_TRY(kernelFor(entry, "backward", backward));
  ATTNRES_TRY(kernelFor(entry, "finalize", finalize));
  ATTNRES_TRY(launch(*runtime, backward, values, {{"B", B}, {"P", P}}, stream));
  ATTNRES_TRY(launch(*runtime, finalize, values, {}, stream));
  return ATTNRES_OK;
}

AttnresStatus attnresMerge(const AttnresRuntime *runtime, int op,
                           const AttnresMergeArgs *args, void *stream,
                           char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "partition_reduce_softmax"));
  if (!args || args->num_rows < 0)
    return report(invalid("args must not be null; num_rows must be >= 0"),
                  error);
  const Op &entry = runtime->ops[op];
  std::string merge;
  ATTNRES_TRY(kernelFor(entry, "merge", merge));
  // A per-query output norm's weight row is row / rows_per_weight.
  for (const Argument &argument : runtime->kernels.at(merge).arguments)
    if (argument.name == "rows_per_weight" && args->rows_per_weight < 1)
      return report(invalid("rows_per_weight must be >= 1 (the rows that "
                            "share an output-norm weight row)"),
                    error);
  Values values;
  values.pointers = {{"partial_o", args->partials},
                     {"partial_lse", args->partial_lse},
                     {"sink", args->sink},
                     {"output_norm", args->output_norm},
                     {"o", args->o},
                     {"lse", args->lse},
                     {"o_pre", args->o_pre},
                     {"o_pre_residual", args->o_pre_residual}};
  values.integers = {{"num_rows", args->num_rows},
                     {"num_partitions", entry.integer("num_partitions")},
                     {"rows_per_weight", args->rows_per_weight}};
  ATTNRES_TRY(
      launch(*runtime, merge, values, {{"rows", args->num_rows}}, stream));
  return ATTNRES_OK;
}

AttnresStatus attnresSum(const AttnresRuntime *runtime, int op,
                         const void *partials, void *output,
                         int64_t numElements, void *stream, char **error) {
  ATTNRES_TRY(checkOp(runtime, op, "partition_reduce_sum"));
  if (numElements < 0)
    return report(invalid("num_elements must be >= 0"), error);
  const Op &entry = runtime->ops[op];
  Values values;
  values.pointers = {{"partials", partials}, {"output", output}};
  values.integers = {{"num_elements", numElements}};
  std::string sum;
  ATTNRES_TRY(kernelFor(entry, "sum", sum));
  ATTNRES_TRY(launch(*runtime, sum, values, {{"N", numElements}}, stream));
  return ATTNRES_OK;
}

} // extern "C"
