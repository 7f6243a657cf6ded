//===- Bundle.cpp - kernel bundles: binaries and a manifest ---------------===//

#include "attnres/Bundle/Bundle.h"
#include "attnres/Bundle/LaunchRules.h"
#include "attnres/Bundle/ManifestSchema.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "attnres/Conversion/Passes.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/MC/MCSubtargetInfo.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <map>

using namespace mlir;
namespace schema = ::attnres::manifest;
namespace launch = ::attnres::launch;
using namespace mlir::attnres;

std::string mlir::attnres::compilerVersion() {
  return std::string("attnres ") + ATTNRES_VERSION + " (LLVM " +
         LLVM_VERSION_STRING + ")";
}

namespace {

/// The largest static token count a spec may name (a launch's grid).
constexpr int64_t kMaxStaticTokens = 2147483647;

bool isNvidia(StringRef target) { return target.starts_with("sm_"); }
bool isAmd(StringRef target) { return target.starts_with("gfx"); }

/// The PTX version a chip needs, as the "+ptxNN" feature (empty: LLVM's
/// default, enough before sm_90). LLVM's defaults are too old for sm_90 and
/// later, and a too-old version is a fatal error in its backend, so every
/// chip LLVM 22 knows is listed; family-specific chips ("f" suffix) need
/// PTX 8.8.
std::string ptxFeatures(StringRef chip) {
  unsigned version = nvidiaChipNumber(chip);
  if (!version)
    return "";
  bool family = chip.ends_with("f");
  unsigned ptx = 0;
  if (version >= 110)
    ptx = 90;
  else if (version == 103 || version == 121)
    ptx = 88;
  else if (version == 120)
    ptx = 87;
  else if (version >= 100)
    ptx = 86;
  else if (version >= 90)
    ptx = 80;
  if (family)
    ptx = std::max(ptx, 88u);
  return ptx ? "+ptx" + std::to_string(ptx) : "";
}

/// Why attnres cannot generate code for a chip LLVM knows, or "" when it
/// can: these are refused before code generation, where LLVM would stop
/// the process or the assembler would fail on the whole module.
std::string unsupportedChip(StringRef chip) {
  if (isNvidia(chip)) {
    if (unsigned version = nvidiaChipNumber(chip); version && version < 70)
      return "the kernels use warp shuffles with a lane mask (shfl.sync), "
             "which need sm_70 or newer";
    return "";
  }
  if (chip.ends_with("-generic"))
    return "it names a family of AMD chips; name the chip (gfx942, gfx950, "
           "gfx1100, ...)";
  if (chip.starts_with("gfx6"))
    return "the assembler rejects the kernels' scalar register counts on "
           "gfx6 chips";
  return "";
}

/// Whether LLVM's backend knows `chip`. An unknown chip must be rejected
/// here: the backend only warns about it and then fails instruction selection
/// with a fatal error.
bool isKnownChip(StringRef target) {
  static const bool initialized = [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeAMDGPUTargetInfo();
    LLVMInitializeAMDGPUTargetMC();
    return true;
  }();
  (void)initialized;
  llvm::Triple triple(isNvidia(target) ? "nvptx64-nvidia-cuda"
                                       : "amdgcn-amd-amdhsa");
  std::string error;
  const llvm::Target *backend =
      llvm::TargetRegistry::lookupTarget(triple, error);
  if (!backend)
    return false;
  std::unique_ptr<llvm::MCSubtargetInfo> subtarget(
      backend->createMCSubtargetInfo(triple, "", ""));
  return subtarget && subtarget->isCPUStringValid(target);
}

llvm::json::Value toJson(Attribute attribute) {
  if (auto string = dyn_cast<StringAttr>(attribute))
    return string.getValue().str();
  if (auto boolean = dyn_cast<BoolAttr>(attribute))
    return boolean.getValue();
  if (auto integer = dyn_cast<IntegerAttr>(attribute))
    return integer.getInt();
  if (auto number = dyn_cast<FloatAttr>(attribute))
    return number.getValueAsDouble();
  if (auto array = dyn_cast<ArrayAttr>(attribute)) {
    llvm::json::Array values;
    for (Attribute element : array)
      values.push_back(toJson(element));
    return values;
  }
  if (auto dictionary = dyn_cast<DictionaryAttr>(attribute)) {
    llvm::json::Object object;
    for (NamedAttribute entry : dictionary)
      object[entry.getName().getValue()] = toJson(entry.getValue());
    return object;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  attribute.print(os);
  return text;
}

/// Why the runtime would refuse these op facts or kernel descriptions
/// (attnres/Bundle/ManifestSchema.h), or "" when it reads them.
std::string outsideSchema(const llvm::json::Array &ops,
                          const llvm::json::Array &kernels) {
  auto check = [](const llvm::json::Object &object,
                  const schema::NumberField &field,
                  const Twine &what) -> std::string {
    std::optional<int64_t> number = object.getInteger(field.key);
    if (!object.get(field.key) ||
        (number && *number >= field.min && *number <= field.max))
      return "";
    std::string shown;
    llvm::raw_string_ostream os(shown);
    os << *object.get(field.key);
    return (what + " has " + field.key + " = " + shown +
            "; bundles hold values in [" + Twine(field.min) + ", " +
            Twine(field.max) + "]")
        .str();
  };
  if (ops.size() > static_cast<size_t>(schema::kMaxOps))
    return "the module has " + std::to_string(ops.size()) +
           " attnres ops; a bundle holds at most " +
           std::to_string(schema::kMaxOps) + " (split the module)";
  if (kernels.size() > static_cast<size_t>(schema::kMaxKernels))
    return "the module has " + std::to_string(kernels.size()) +
           " kernels; a bundle holds at most " +
           std::to_string(schema::kMaxKernels) + " (split the module)";
  llvm::StringMap<const llvm::json::Object *> byName;
  for (const llvm::json::Value &kernel : kernels)
    if (const llvm::json::Object *description = kernel.getAsObject())
      byName[description->getString("name").value_or("")] = description;
  for (const llvm::json::Value &op : ops) {
    const llvm::json::Object *facts = op.getAsObject();
    if (!facts)
      continue;
    for (const auto &field : schema::kOpFacts)
      if (std::string problem = check(*facts, field, "an attnres op");
          !problem.empty())
        return problem;
    // The kernels the runtime launches for the op take only what it
    // supplies to their role.
    std::string kind = facts->getString("op").value_or("").str();
    for (const schema::KernelRole &role : schema::kKernelRoles) {
      std::optional<StringRef> name = facts->getString(role.role);
      if (kind != role.opKind || !name)
        continue;
      const llvm::json::Object *description = byName.lookup(*name);
      if (!description)
        return ("the " + kind + " op names no described kernel " + *name).str();
      const llvm::json::Array *arguments = description->getArray("arguments");
      if (arguments &&
          arguments->size() > static_cast<size_t>(schema::kMaxKernelArguments))
        return ("kernel " + *name + " takes " + Twine(arguments->size()) +
                " arguments; a bundle's kernels take at most " +
                Twine(schema::kMaxKernelArguments))
            .str();
      for (size_t i = 0, e = arguments ? arguments->size() : 0; i < e; ++i)
        if (const llvm::json::Object *entry = (*arguments)[i].getAsObject()) {
          schema::ArgumentDescription parsed;
          parsed.name = entry->getString("name").value_or("").str();
          parsed.kind = entry->getString("kind").value_or("").str();
          parsed.type = entry->getString("type").value_or("").str();
          if (std::string problem = schema::argumentProblem(role, parsed);
              !problem.empty())
            return ("kernel " + *name + ": " + problem).str();
        }
      if (const llvm::json::Array *grid = description->getArray("grid"))
        for (const llvm::json::Value &dim : *grid)
          if (const llvm::json::Object *rule = dim.getAsObject())
            if (std::string problem = schema::gridProblem(
                    role, rule->getString("symbol").value_or("").str());
                !problem.empty())
              return ("kernel " + *name + ": " + problem).str();
    }
  }
  for (const llvm::json::Value &kernel : kernels) {
    const llvm::json::Object *description = kernel.getAsObject();
    if (!description)
      continue;
    std::string name =
        description->getString("name").value_or("a kernel").str();
    for (const auto &field : {schema::kKernelBlock, schema::kKernelVectorWidth})
      if (std::string problem = check(*description, field, "kernel " + name);
          !problem.empty())
        return problem;
    if (const llvm::json::Array *arguments = description->getArray("arguments"))
      for (const llvm::json::Value &argument : *arguments)
        if (const llvm::json::Object *entry = argument.getAsObject()) {
          if (std::string problem = check(*entry, schema::kArgumentAlignment,
                                          "an argument of kernel " + name);
              !problem.empty())
            return problem;
          if (std::optional<int64_t> alignment =
                  entry->getInteger(schema::kArgumentAlignment.key);
              alignment && !schema::isPowerOfTwo(*alignment))
            return "an argument of kernel " + name +
                   " has alignment = " + std::to_string(*alignment) +
                   "; it must be a power of two";
        }
    if (const llvm::json::Array *grid = description->getArray("grid"))
      for (const llvm::json::Value &dim : *grid)
        if (const llvm::json::Object *rule = dim.getAsObject())
          for (const auto &field : {schema::kGridScale, schema::kGridDivisor})
            if (std::string problem =
                    check(*rule, field, "a grid rule of kernel " + name);
                !problem.empty())
              return problem;
  }
  return "";
}

/// Turns off the printing of an op next to its diagnostics while alive. A
/// pass that fails on a kernel (kernel options that ask for more workgroup
/// memory than a block may have) or an assembler that fails on a gpu.module
/// reports on an op that prints as thousands of lines; its message names the
/// problem without them.
class NoOpPrinting {
public:
  explicit NoOpPrinting(MLIRContext *context)
      : context(context), printed(context->shouldPrintOpOnDiagnostic()) {
    context->printOpOnDiagnostic(false);
  }
  ~NoOpPrinting() { context->printOpOnDiagnostic(printed); }
  NoOpPrinting(const NoOpPrinting &) = delete;
  NoOpPrinting &operator=(const NoOpPrinting &) = delete;

private:
  MLIRContext *context;
  bool printed;
};

std::string extensionFor(StringRef target, StringRef format) {
  if (format == "isa")
    return isNvidia(target) ? "ptx" : "s";
  if (format == "fatbin")
    return "fatbin";
  return isNvidia(target) ? "cubin" : "hsaco";
}

} // namespace

FailureOr<Bundle> mlir::attnres::compileBundle(ModuleOp module,
                                               const BundleOptions &options) {
  MLIRContext *context = module.getContext();
  NoOpPrinting quiet(context);
  Location loc = module.getLoc();
  StringRef target = options.target;
  if (!isNvidia(target) && !isAmd(target))
    return emitError(loc) << "unknown target '" << target
                          << "': expected an NVIDIA chip (sm_80, sm_90, "
                             "sm_100, ...) or an AMD one (gfx942, gfx950, ...)";
  if (!isKnownChip(target))
    return emitError(loc) << "unknown target '" << target
                          << "': LLVM 22 has no such "
                          << (isNvidia(target) ? "NVIDIA" : "AMD") << " chip";
  if (std::string reason = unsupportedChip(target); !reason.empty())
    return emitError(loc) << "target '" << target
                          << "' is not supported: " << reason;
  if (options.format != "bin" && options.format != "isa" &&
      options.format != "fatbin")
    return emitError(loc) << "unknown format '" << options.format
                          << "': expected bin, isa or fatbin";
  if (options.optLevel < 0 || options.optLevel > 3)
    return emitError(loc) << "opt level must be 0, 1, 2 or 3, got "
                          << options.optLevel;
  if (isAmd(target) && options.format == "fatbin")
    return emitError(loc) << "format fatbin is NVIDIA-only";
  if (failed(verify(module)))
    return failure();

  // 1. Kernels, with their descriptions, which the manifest is written from.
  int64_t subgroupSize = isNvidia(target) ? 32 : 64;
  PassManager kernels(context);
  std::unique_ptr<Pass> lowering = createConvertAttnResToGPU();
  // Every option of the lowering takes a whole number or true/false. LLVM's
  // option parser prints a bad value's reason to stderr, not to the error
  // it returns: such values are refused here, by name.
  for (StringRef item : llvm::split(options.kernelOptions, ' ')) {
    auto [key, value] = item.split('=');
    // The clustered forward's instructions exist from sm_90 on: asked for
    // elsewhere, it would fail in the NVVM verifier with no location.
    if (key == "clusters" && (value == "1" || value == "true") &&
        !hasClusters(target))
      return emitError(loc)
             << "bad kernel options '" << options.kernelOptions
             << "': clusters=1 needs thread-block clusters (NVIDIA sm_90 and "
                "later), which "
             << target << " does not have";
    int64_t number;
    if (value.empty() || value == "true" || value == "false" ||
        !value.getAsInteger(10, number))
      continue;
    return emitError(loc) << "bad kernel options '" << options.kernelOptions
                          << "': " << key
                          << " takes a whole number (or true / false), got '"
                          << value << "'";
  }
  std::string optionError;
  // The chip's facts go first, so that the caller's kernel options can
  // turn asynchronous copies or clusters off; the subgroup size is not theirs
  // to pick.
  std::string chipOptions =
      std::string(hasAsyncCopies(target) ? "async-copies=1 "
                                         : "async-copies=0 ") +
      (hasClusters(target) ? "clusters=1 " : "clusters=0 ");
  if (failed(lowering->initializeOptions(
          chipOptions + options.kernelOptions +
              " subgroup-size=" + std::to_string(subgroupSize),
          [&](const Twine &message) {
            optionError = message.str();
            return failure();
          })))
    return emitError(loc) << "bad kernel options '" << options.kernelOptions
                          << "': "
                          << (optionError.empty()
                                  ? "see the options of convert-attnres-to-gpu "
                                    "(attnres-opt --help)"
                                  : optionError);
  // The GPU pipelines' decomposition stage, at `auto`: a bundle's ops stay
  // whole, and the runtime sizes their launches per call.
  buildDecompositionPasses(kernels, /*forwardPartitions=*/0,
                           /*backwardBlocks=*/0, /*tileSizes=*/{},
                           /*transformLibrary=*/"");
  kernels.addPass(std::move(lowering));
  if (failed(kernels.run(module)))
    return failure();
  llvm::json::Array ops, kernelDescriptions;
  module.walk([&](gpu::GPUModuleOp gpuModule) {
    if (auto described = gpuModule->getAttrOfType<ArrayAttr>("attnres.ops"))
      for (Attribute op : described)
        ops.push_back(toJson(op));
    gpuModule.walk([&](gpu::GPUFuncOp func) {
      if (auto kernel = func->getAttr("attnres.kernel")) {
        llvm::json::Value description = toJson(kernel);
        description.getAsObject()->try_emplace("module",
                                               gpuModule.getSymName().str());
        kernelDescriptions.push_back(std::move(description));
      }
    });
  });

  if (std::string problem = outsideSchema(ops, kernelDescriptions);
      !problem.empty())
    return emitError(loc) << problem;

  // 2. Binaries.
  PassManager binaries(context);
  std::string features;
  if (isNvidia(target)) {
    NVVMPipelineOptions nvvm;
    nvvm.chip = options.target;
    nvvm.features = features = ptxFeatures(target);
    nvvm.format = options.format;
    nvvm.optLevel = options.optLevel;
    if (!options.cudaToolkit.empty())
      nvvm.toolkit = options.cudaToolkit;
    buildGPUModuleToNVVMBinary(binaries, nvvm);
  } else {
    ROCDLPipelineOptions rocdl;
    rocdl.chip = options.target;
    rocdl.format = options.format;
    rocdl.optLevel = options.optLevel;
    if (!options.rocmToolkit.empty())
      rocdl.toolkit = options.rocmToolkit;
    buildGPUModuleToROCDLBinary(binaries, rocdl);
  }
  // A failing assembler or linker (say, a CUDA toolkit that no longer
  // knows the chip) reports on the gpu.module (NoOpPrinting, above).
  if (failed(binaries.run(module)))
    return failure();

  Bundle bundle;
  llvm::json::Array binaryFiles;
  module.walk([&](gpu::BinaryOp binary) {
    for (Attribute object : binary.getObjects()) {
      auto gpuObject = cast<gpu::ObjectAttr>(object);
      std::string name = (binary.getSymName() + "." + target + "." +
                          extensionFor(target, options.format))
                             .str();
      bundle.files.push_back({name, gpuObject.getObject().getValue().str()});
      binaryFiles.push_back(llvm::json::Object{
          {schema::kFile, name}, {"module", binary.getSymName().str()}});
    }
  });
  if (bundle.files.empty())
    return emitError(loc) << "no GPU binary was produced";

  // The launch rules' constants (manifest "rules"), which the runtime
  // evaluates with attnres/Bundle/LaunchRules.h.
  const launch::Rules &rules = launch::kDefaultRules;
  llvm::json::Object manifest{
      {schema::kFormatVersionKey, schema::kFormatVersion},
      {"compiler", compilerVersion()},
      {schema::kTarget,
       llvm::json::Object{
           {"chip", options.target},
           {schema::kVendor, isNvidia(target) ? "nvidia" : "amd"},
           {"format", options.format},
           {"subgroup_size", subgroupSize}}},
      {"options",
       llvm::json::Object{{"opt_level", options.optLevel},
                          {"features", features},
                          {"kernel_options", options.kernelOptions}}},
      {schema::kBinaries, std::move(binaryFiles)},
      {schema::kRules,
       llvm::json::Object{
           {"sources",
            "Sources and source gradients are passed as a device table of L "
            "pointers, one [N, D] row-major buffer each (packed sources: "
            "base + l * N * D)."},
           {"alignment",
            "Each buffer or table argument of a kernel must be aligned to its "
            "`alignment` bytes (the widest access the kernel makes through "
            "it), which the runtime checks; the rows a table points to, to "
            "the kernel's vector_width times their element size."},
           {"forward",
            llvm::formatv(
                "Partitions P = max(1, min(floor({0} * SMs / ceil(N / "
                "rows_per_block)), floor(L / {1}), floor(L * D * value bytes "
                "/ {2}))). P = 1: launch `forward`. P > 1: `forward_partial` "
                "(grid y = P) into FP32 workspaces partial_o [P, M, N, D] and "
                "partial_lse [P, M, N], then `merge` with num_rows = M * N, "
                "num_partitions = P and rows_per_weight = N. Where the op "
                "also names `forward_cluster` (sm_90 and later), that one "
                "kernel (grid ceil(N / rows_per_block) x P', the P' blocks of "
                "a block of rows one cluster: cluster_y) does both, with no "
                "workspace, for the largest P' >= 2 up to max(P, min(floor({0} "
                "* SMs / ceil(N / rows_per_block)), floor(L / {1}), 8)) (the "
                "second term 1 where L < {3}) for which the device holds all "
                "ceil(N / rows_per_block) clusters of P' blocks at once; "
                "where none does, the kernels above.",
                rules.blocksPerMultiprocessor, rules.sourcesPerPartition,
                rules.partitionBytes, launch::kClusteredMinSources)
                .str()},
           {"backward",
            llvm::formatv(
                "Token blocks B = max(1, min({0} * SMs, ceil(N / "
                "(rows_per_block * {2})))) and source partitions P = max(1, "
                "min(floor({0} * SMs / B), floor(L / {1}))). `backward` (grid "
                "B x P) writes the source gradients and FP32 workspaces "
                "partial_da [P * B * partial_rows_per_block, M, R] and "
                "partial_dh [P * B * partial_rows_per_block, M or 1, D]; then "
                "`finalize` with num_partial_rows = P * B * "
                "partial_rows_per_block.",
                rules.blocksPerMultiprocessor, rules.sourcesPerPartition,
                rules.tokensPerBlock)
                .str()},
           // The same rules as numbers, which the runtime evaluates (in
           // the order of ManifestSchema.h's kLaunchRules).
           {schema::kLaunch,
            llvm::json::Object{
                {schema::kLaunchRules[0].key, rules.blocksPerMultiprocessor},
                {schema::kLaunchRules[1].key, rules.sourcesPerPartition},
                {schema::kLaunchRules[2].key, rules.partitionBytes},
                {schema::kLaunchRules[3].key, rules.tokensPerBlock}}},
           {"grid", "Each grid dimension is ceil(symbol * scale / divisor), "
                    "symbol one of N (tokens), P, B, rows, 1."}}},
      {schema::kOps, std::move(ops)},
      {schema::kKernels, std::move(kernelDescriptions)}};
  bundle.manifest =
      llvm::formatv("{0:2}", llvm::json::Value(std::move(manifest))).str();
  // The runtime's caps on what it reads (ManifestSchema.h).
  if (bundle.manifest.size() > static_cast<size_t>(schema::kMaxManifestBytes))
    return emitError(loc) << "the manifest would be " << bundle.manifest.size()
                          << " bytes; a bundle's may be at most "
                          << schema::kMaxManifestBytes << " (split the module)";
  for (const BundleFile &file : bundle.files)
    if (file.contents.size() > static_cast<size_t>(schema::kMaxBinaryBytes))
      return emitError(loc)
             << "the binary " << file.name << " would be "
             << file.contents.size() << " bytes; a bundle's may be at most "
             << schema::kMaxBinaryBytes << " (split the module)";
  return bundle;
}

LogicalResult mlir::attnres::writeBundle(const Bundle &bundle,
                                         StringRef directory,
                                         std::string &error) {
  if (std::error_code code = llvm::sys::fs::create_directories(directory)) {
    error = "cannot create '" + directory.str() + "': " + code.message();
    return failure();
  }
  auto write = [&](StringRef name, StringRef contents) -> LogicalResult {
    SmallString<256> path(directory);
    llvm::sys::path::append(path, name);
    std::error_code code;
    llvm::raw_fd_ostream os(path, code);
    if (code) {
      error = "cannot write '" + path.str().str() + "': " + code.message();
      return failure();
    }
    os << contents;
    return success();
  };
  for (const BundleFile &file : bundle.files)
    if (failed(write(file.name, file.contents)))
      return failure();
  return write("manifest.json", bundle.manifest);
}

//===----------------------------------------------------------------------===//
// Specs
//===----------------------------------------------------------------------===//

FailureOr<OwningOpRef<ModuleOp>>
mlir::attnres::moduleFromSpec(MLIRContext *context, StringRef spec,
                              std::string &error) {
  auto [kind, rest] = spec.split(':');
  if (kind != "forward" && kind != "backward" && kind != "train") {
    error = "spec must start with forward:, backward: or train:, got '" +
            spec.str() + "'";
    return failure();
  }
  // A quoted item in a message: what the user wrote, cut short.
  auto quote = [](StringRef text) {
    return "'" +
           (text.size() > 40 ? text.take_front(40).str() + "..." : text.str()) +
           "'";
  };
  std::map<std::string, std::string> items;
  SmallVector<StringRef> parts;
  rest.split(parts, ',', -1, /*KeepEmpty=*/false);
  static const char *const flags[] = {"key_norm", "packed", "multi_query",
                                      "grad_lse", "accumulate"};
  static const char *const known[] = {
      "L",           "D",        "R",           "M",      "dtype",
      "param_dtype", "key_norm", "output_norm", "save",   "eps",
      "scale",       "packed",   "multi_query", "tokens", "output_dtype",
      "grad_lse",    "accumulate"};
  for (StringRef part : parts) {
    StringRef item = part.trim();
    auto [key, value] = item.split('=');
    bool hasValue = item.contains('=');
    if (llvm::find(known, key) == std::end(known)) {
      error = "unknown spec item " + quote(key);
      return failure();
    }
    if (items.count(key.str())) {
      error = "spec item " + key.str() + " is given twice";
      return failure();
    }
    bool flag = llvm::find(flags, key) != std::end(flags);
    if (flag && hasValue) {
      error = "spec item " + key.str() + " is a flag and takes no value, got " +
              quote(item);
      return failure();
    }
    // output_norm is the one item that is a flag or takes a value; an item
    // written with '=' needs one, as for every other item.
    if (!flag && value.empty() && (key != "output_norm" || hasValue)) {
      error = "spec item " + key.str() + " needs a value (" + key.str() +
              "=...)" +
              (key == "output_norm" ? ", or no '=' for one weight" : "");
      return failure();
    }
    items[key.str()] = value.str();
  }
  // Values that name a choice, checked here: they become MLIR text.
  auto oneOf = [&](StringRef key, ArrayRef<StringRef> choices) {
    auto it = items.find(key.str());
    if (it == items.end() || llvm::is_contained(choices, it->second))
      return true;
    error = "spec item " + key.str() + " must be one of " +
            llvm::join(choices, ", ") + "; got " + quote(it->second);
    return false;
  };
  if (!oneOf("dtype", {"bf16", "f16", "f32"}) ||
      !oneOf("param_dtype", {"bf16", "f16", "f32"}) ||
      !oneOf("output_dtype", {"bf16", "f16", "f32"}) ||
      !oneOf("save", {"o_pre", "o_pre_residual", "lse"}))
    return failure();
  if (auto it = items.find("output_norm");
      it != items.end() && !it->second.empty() && it->second != "per_query") {
    error = "spec item output_norm is output_norm (one weight) or "
            "output_norm=per_query; got " +
            quote("output_norm=" + it->second);
    return failure();
  }
  auto integer = [&](StringRef key, int64_t fallback) -> int64_t {
    auto it = items.find(key.str());
    int64_t value;
    if (it == items.end())
      return fallback;
    if (StringRef(it->second).getAsInteger(10, value)) {
      error = "spec item " + key.str() + " must be an integer, got '" +
              it->second + "'";
      return -1;
    }
    return value;
  };
  auto text = [&](StringRef key, StringRef fallback) -> std::string {
    auto it = items.find(key.str());
    return it == items.end() ? fallback.str() : it->second;
  };
  if (!items.count("L") || !items.count("D")) {
    error = "spec needs L= and D=";
    return failure();
  }
  int64_t L = integer("L", 0), D = integer("D", 0);
  int64_t R = integer("R", D), M = integer("M", 1);
  if (!error.empty())
    return failure();
  // The op's limits, checked before any IR is built: a spec of a hundred
  // million sources would otherwise build that many arguments first.
  for (auto [key, value, limit] :
       {std::make_tuple("L", L, kMaxSources),
        std::make_tuple("D", D, kMaxWidth),
        std::make_tuple("R", R, std::min(D, kMaxWidth)),
        std::make_tuple("M", M, kMaxQueries)})
    if (value < 1 || value > limit) {
      error = std::string("spec item ") + key + "=" + std::to_string(value) +
              " is out of range [1, " + std::to_string(limit) + "]" +
              (std::string(key) == "R" ? " (R <= D)" : "");
      return failure();
    }
  std::string dtype = text("dtype", "bf16");
  std::string param = text("param_dtype", dtype);
  std::string outputType = text("output_dtype", dtype);
  std::string tokens = text("tokens", "?");
  if (int64_t count = 0;
      tokens != "?" &&
      (StringRef(tokens).getAsInteger(10, count) || count < 1 ||
       count > kMaxStaticTokens || std::to_string(count) != tokens)) {
    error = "spec item tokens must be ? or a token count in [1, " +
            std::to_string(kMaxStaticTokens) + "], got '" + tokens + "'";
    return failure();
  }
  bool packed = items.count("packed");
  bool multi = items.count("multi_query") || M > 1;
  bool keyNorm = items.count("key_norm");
  bool outputNorm = items.count("output_norm");
  bool gradLse = items.count("grad_lse");
  if (gradLse && kind == "forward") {
    error = "spec item grad_lse (the lse's gradient, an operand of the "
            "backward) needs a backward: or train: spec";
    return failure();
  }
  bool accumulate = items.count("accumulate");
  if (accumulate && kind == "forward") {
    error = "spec item accumulate (the backward adds its source gradients "
            "into the ones given) needs a backward: or train: spec";
    return failure();
  }
  bool perQuery = text("output_norm", "") == "per_query";
  std::string save = text("save", "o_pre");
  double eps = 1e-6, scale = 1.0;
  for (auto [key, out] :
       {std::make_pair("eps", &eps), std::make_pair("scale", &scale)}) {
    auto it = items.find(key);
    if (it != items.end() && StringRef(it->second).getAsDouble(*out)) {
      error = std::string("spec item ") + key + " must be a number, got '" +
              it->second + "'";
      return failure();
    }
  }

  // The module, built with the ops' builders: the spec's values never pass
  // through MLIR text.
  context->loadDialect<func::FuncDialect, AttnResDialect>();
  OpBuilder b(context);
  Location loc = b.getUnknownLoc();
  auto elementType = [&](StringRef name) -> Type {
    if (name == "bf16")
      return b.getBF16Type();
    if (name == "f16")
      return b.getF16Type();
    return b.getF32Type();
  };
  Type value = elementType(dtype), parameter = elementType(param);
  Type output = elementType(outputType);
  int64_t T = ShapedType::kDynamic;
  if (tokens != "?")
    StringRef(tokens).getAsInteger(10, T);
  SmallVector<int64_t> lead;
  if (multi)
    lead.push_back(M);
  auto tensor = [](ArrayRef<int64_t> leading, ArrayRef<int64_t> shape,
                   Type element) {
    SmallVector<int64_t> dims(leading);
    llvm::append_range(dims, shape);
    return RankedTensorType::get(dims, element);
  };
  Type sourceType = tensor({}, {T, D}, value);
  Type packedType = tensor({}, {L, T, D}, value);
  Type perQueryType = tensor(lead, {T, D}, output);
  // The gradient of o has o's type (f32 for FP32 partial outputs).
  Type gradType = tensor(lead, {T, D}, output);
  Type lseType = tensor(lead, {T}, b.getF32Type());
  Type queryType = tensor(lead, {R}, parameter);
  Type keyNormType = tensor({}, {R}, parameter);
  Type outputNormType =
      perQuery ? tensor({}, {M, D}, parameter) : tensor({}, {D}, parameter);
  // The residual of the saved o_pre: [M?, T..., D/2] i8 (an odd D or an f32
  // output is refused by the verifier).
  Type residualType = tensor(lead, {T, D / 2}, b.getI8Type());

  bool forward = kind != "backward", backward = kind != "forward";
  bool residual = save == "o_pre_residual";
  bool savesOutput = save != "lse";
  bool savesOPre = savesOutput && outputNorm;
  SaveMode saveMode = save == "lse"     ? SaveMode::Lse
                      : save == "o_pre" ? SaveMode::OPre
                                        : SaveMode::OPreResidual;

  SmallVector<Type> arguments(packed ? 1 : L, packed ? packedType : sourceType);
  arguments.push_back(queryType);
  if (keyNorm)
    arguments.push_back(keyNormType);
  if (outputNorm)
    arguments.push_back(outputNormType);
  if (backward) {
    arguments.push_back(gradType);
    if (!forward) {
      arguments.push_back(lseType);
      if (savesOutput)
        arguments.push_back(perQueryType);
      if (residual)
        arguments.push_back(residualType);
    }
    if (gradLse)
      arguments.push_back(lseType);
    if (accumulate)
      arguments.append(packed ? 1 : L, packed ? packedType : sourceType);
  }
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  b.setInsertionPointToEnd(module->getBody());
  auto function = func::FuncOp::create(
      b, loc, "attnres", b.getFunctionType(arguments, TypeRange()));
  Block *entry = function.addEntryBlock();
  b.setInsertionPointToEnd(entry);
  ValueRange args = entry->getArguments();
  ValueRange sources = args.take_front(packed ? 1 : L);
  args = args.drop_front(sources.size());
  auto next = [&](bool present) -> Value {
    if (!present)
      return Value();
    Value front = args.front();
    args = args.drop_front();
    return front;
  };
  Value query = next(true), keyNormWeight = next(keyNorm),
        outputNormWeight = next(outputNorm);
  Value lse, saved, savedResidual;
  if (forward) {
    auto op = ForwardOp::create(
        b, loc, perQueryType, lseType, savesOPre ? perQueryType : Type(),
        residual ? residualType : Type(), sources, packed, query, keyNormWeight,
        outputNormWeight, APFloat(eps), APFloat(scale), saveMode);
    lse = op.getLse();
    if (savesOutput)
      saved = savesOPre ? op.getOPre() : op.getOutput();
    savedResidual = op.getOPreResidual();
  }
  if (backward) {
    Value grad = next(true);
    if (!forward) {
      lse = next(true);
      saved = next(savesOutput);
      savedResidual = next(residual);
    }
    Value gradLseValue = next(gradLse);
    ValueRange accumulated = accumulate ? args : ValueRange();
    SmallVector<Type> sourceGrads(packed ? 1 : L,
                                  packed ? packedType : sourceType);
    BackwardOp::create(
        b, loc, sourceGrads, queryType, keyNorm ? keyNormType : Type(),
        outputNorm ? outputNormType : Type(), sources, packed, query,
        keyNormWeight, outputNormWeight, grad, lse, saved, savedResidual,
        gradLseValue, accumulated, APFloat(eps), APFloat(scale));
  }
  func::ReturnOp::create(b, loc);

  // The verifier's diagnostics become the error.
  std::string diagnostics;
  ScopedDiagnosticHandler handler(context, [&](Diagnostic &diag) {
    diagnostics += diag.str() + "\n";
    return success();
  });
  if (failed(verify(*module))) {
    error = "spec '" + spec.str() + "' is not a valid attnres op: " +
            StringRef(diagnostics).trim().str();
    return failure();
  }
  return module;
}
