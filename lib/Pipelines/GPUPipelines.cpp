//===- GPUPipelines.cpp - attnres to NVVM and ROCDL binaries --------------===//
//
// Composed from upstream passes: the kernels of convert-attnres-to-gpu are
// lowered with convert-gpu-to-nvvm / convert-gpu-to-rocdl and serialized by
// gpu-module-to-binary. Math lowers to libdevice (NVVM, linked from the CUDA
// toolkit) or OCML (ROCDL, from Debian's rocm-device-libs).
//
//===----------------------------------------------------------------------===//

#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/Transforms/Passes.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Dialect/Transform/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <dlfcn.h>

using namespace mlir;

std::string attnres::defaultCudaToolkit() {
  return ATTNRES_DEFAULT_CUDA_TOOLKIT;
}

std::string attnres::defaultRocmToolkit() {
  // The file this function was loaded from: a tool in <prefix>/bin, or a
  // shared library (the C API, the mlir-opt plugin) in <prefix>/lib.
  Dl_info info;
  if (dladdr(reinterpret_cast<void *>(&attnres::defaultRocmToolkit), &info) &&
      info.dli_fname) {
    llvm::SmallString<256> folder(info.dli_fname);
    llvm::sys::path::remove_filename(folder);
    // Installed: <prefix>/lib/attnres/rocm-toolkit. Build tree:
    // <build>/rocm-toolkit, next to bin/ and lib/.
    for (const char *relative :
         {"attnres/rocm-toolkit", "../lib/attnres/rocm-toolkit",
          "../rocm-toolkit"}) {
      llvm::SmallString<256> candidate(folder);
      llvm::sys::path::append(candidate, relative);
      if (llvm::sys::fs::is_directory(candidate))
        return std::string(candidate);
    }
  }
  // None: the ROCDL target's own search (ROCM_PATH, /opt/rocm).
  return "";
}

/// Attaches the target, lowers the device code of every gpu.module with
/// `toVendor` (convert-gpu-to-nvvm or -rocdl) and serializes it: the part
/// both vendors share.
static void buildGPUModuleToBinary(OpPassManager &pm,
                                   std::unique_ptr<Pass> attachTarget,
                                   std::unique_ptr<Pass> toVendor,
                                   StringRef format, StringRef toolkit) {
  pm.addPass(std::move(attachTarget));
  OpPassManager &device = pm.nest<gpu::GPUModuleOp>();
  // The index arithmetic of an outlined tile loop's iteration.
  device.addPass(createLowerAffinePass());
  // The vendor conversion lowers the vector ops too, with the GPU address
  // spaces mapped (vector loads from workgroup memory); convert-vector-to-llvm
  // on its own would not know them.
  device.addPass(createSCFToControlFlowPass());
  device.addPass(std::move(toVendor));
  device.addPass(createConvertVectorToLLVMPass());
  device.addPass(createCanonicalizerPass());
  device.addPass(createCSEPass());
  device.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = format.str();
  binary.toolkitPath = toolkit.str();
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::attnres::buildGPUModuleToNVVMBinary(
    OpPassManager &pm, const NVVMPipelineOptions &options) {
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.indexBitwidth = 64;
  buildGPUModuleToBinary(pm, createGpuNVVMAttachTarget(target),
                         createConvertGpuOpsToNVVMOps(nvvm), options.format,
                         options.toolkit);
}

unsigned mlir::attnres::nvidiaChipNumber(StringRef chip) {
  unsigned number = 0;
  if (!chip.starts_with("sm_") ||
      chip.drop_front(3).take_while(llvm::isDigit).getAsInteger(10, number))
    return 0;
  return number;
}

bool mlir::attnres::hasAsyncCopies(StringRef chip) {
  return nvidiaChipNumber(chip) >= 80;
}

bool mlir::attnres::hasClusters(StringRef chip) {
  return nvidiaChipNumber(chip) >= 90;
}

template <typename Derived>
LogicalResult mlir::attnres::checkGPUPipelineOptions(
    StringRef pipeline, const GPUPipelineOptions<Derived> &options,
    function_ref<LogicalResult(const Twine &)> errorHandler) {
  if (llvm::any_of(options.tileSizes, [](int64_t size) { return size < 0; }))
    return errorHandler(pipeline + ": tile sizes must be >= 0 (0: untiled)");
  if (!options.keepHost &&
      (!options.tileSizes.empty() || !options.transformLibrary.empty()))
    return errorHandler(pipeline +
                        ": tile-sizes and transform-library tile the "
                        "launches of keep-host=1; a bundle's ops are "
                        "launched whole");
  if (!options.tileSizes.empty() && !options.transformLibrary.empty())
    return errorHandler(pipeline +
                        ": tile-sizes and transform-library both tile the "
                        "ops; give one");
  if (options.forwardPartitions < 0 || options.backwardBlocks < 0 ||
      options.backwardPartitions < 0)
    return errorHandler(pipeline +
                        ": forward-partitions, backward-blocks and "
                        "backward-partitions must be >= 0 (0: the rules)");
  if (!options.keepHost &&
      (options.forwardPartitions || options.backwardBlocks ||
       options.backwardPartitions))
    return errorHandler(
        pipeline + ": forward-partitions, backward-blocks and "
                   "backward-partitions fix the launches of keep-host=1; "
                   "a bundle's launches take them per call (the "
                   "runtime's AttnresForwardArgs and AttnresBackwardArgs)");
  return success();
}

template LogicalResult mlir::attnres::checkGPUPipelineOptions(
    StringRef, const GPUPipelineOptions<NVVMPipelineOptions> &,
    function_ref<LogicalResult(const Twine &)>);
template LogicalResult mlir::attnres::checkGPUPipelineOptions(
    StringRef, const GPUPipelineOptions<ROCDLPipelineOptions> &,
    function_ref<LogicalResult(const Twine &)>);

void mlir::attnres::buildDecompositionPasses(OpPassManager &pm,
                                             int64_t forwardPartitions,
                                             int64_t backwardBlocks,
                                             ArrayRef<int64_t> tileSizes,
                                             StringRef transformLibrary) {
  // The decompositions (the forward's partitions, the backward's blocks of
  // tokens, the token tiles of a block) are IR that convert-attnres-to-gpu
  // launches on the grid it states. `auto` leaves every op whole (the
  // device is known only when the code runs: num-multiprocessors=0), and
  // its kernels are sized at run time from the token count and the
  // device's occupancy, by the bundle runtime or by the kept host code,
  // with the same rules (attnres/Bundle/LaunchRules.h).
  attnres::AttnResSplitSourcesOptions sources;
  if (forwardPartitions != 0)
    sources.partitions = std::to_string(forwardPartitions);
  else
    sources.numMultiprocessors = 0;
  pm.addPass(attnres::createAttnResSplitSources(sources));
  attnres::AttnResSplitReductionOptions reduction;
  if (backwardBlocks != 0)
    reduction.blocks = std::to_string(backwardBlocks);
  else
    reduction.numMultiprocessors = 0;
  pm.addPass(attnres::createAttnResSplitReduction(reduction));
  // The user's tiling: attnres-tile's sizes, or a transform script.
  if (transformLibrary.empty()) {
    attnres::AttnResTileOptions tile;
    tile.tileSizes.assign(tileSizes.begin(), tileSizes.end());
    pm.addPass(attnres::createAttnResTile(tile));
  } else {
    transform::PreloadLibraryPassOptions library;
    library.transformLibraryPaths = {transformLibrary.str()};
    pm.addPass(transform::createPreloadLibraryPass(library));
    pm.addPass(transform::createInterpreterPass());
  }
  // The loops' place on the GPU, as upstream mapping attributes.
  pm.addPass(attnres::createAttnResMapToBlocks());
}

/// The pipeline both vendors share: `kernels` carries the vendor's kernel
/// choices, `buildBinary` lowers and serializes the gpu.module.
template <typename Derived>
static void
buildLowerToGPUPipeline(OpPassManager &pm,
                        const attnres::GPUPipelineOptions<Derived> &options,
                        attnres::ConvertAttnResToGPUOptions kernels,
                        function_ref<void(OpPassManager &)> buildBinary) {
  kernels.keepHost = options.keepHost;
  kernels.backwardPartitions = options.backwardPartitions;
  attnres::buildDecompositionPasses(pm, options.forwardPartitions,
                                    options.backwardBlocks, options.tileSizes,
                                    options.transformLibrary);
  pm.addPass(attnres::createConvertAttnResToGPU(kernels));
  if (!options.keepHost) {
    buildBinary(pm);
    return;
  }
  // The host functions: tensors become device buffers (function arguments
  // and results too, with identity layouts, so a caller passes plain
  // descriptors), the attnres ops on buffers launches of their kernels, the
  // GPU operations are chained on a stream, and after the kernels are
  // serialized the host code is lowered to the LLVM dialect the way
  // upstream's gpu-lower-to-nvvm-pipeline lowers it. Nothing here is
  // vendor-specific: gpu-to-llvm calls the mgpu* functions either vendor's
  // runtime wrappers implement.
  pm.addPass(attnres::createAttnResBufferizeHost());
  pm.addPass(attnres::createAttnResLaunchKernels());
  // A forward's or merge's tile loop: a gpu.launch whose body is the
  // tile's thread code, made a kernel by upstream's outlining.
  attnres::AttnResLowerTilesToGPUOptions tiles;
  tiles.subgroupSize = kernels.subgroupSize;
  tiles.asyncCopies = kernels.asyncCopies;
  tiles.mergeLoadsInFlight = kernels.mergeLoadsInFlight;
  tiles.backwardStagedBatches = kernels.backwardStagedBatches;
  pm.addPass(attnres::createAttnResLowerTilesToGPU(tiles));
  pm.addPass(createGpuKernelOutliningPass());
  pm.addNestedPass<func::FuncOp>(createGpuAsyncRegionPass());
  buildBinary(pm);
  pm.addPass(createSCFToControlFlowPass());
  // Views of reshaped buffers (the split passes merge token dimensions)
  // leave affine index arithmetic.
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createGpuToLLVMConversionPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::attnres::buildLowerToNVVMPipeline(
    OpPassManager &pm, const NVVMPipelineOptions &options) {
  ConvertAttnResToGPUOptions kernels;
  kernels.subgroupSize = 32;
  kernels.asyncCopies = hasAsyncCopies(options.chip);
  kernels.clusters = hasClusters(options.chip);
  buildLowerToGPUPipeline(pm, options, kernels, [&](OpPassManager &pm) {
    buildGPUModuleToNVVMBinary(pm, options);
  });
}

void mlir::attnres::buildGPUModuleToROCDLBinary(
    OpPassManager &pm, const ROCDLPipelineOptions &options) {
  GpuROCDLAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  ConvertGpuOpsToROCDLOpsOptions rocdl;
  rocdl.chipset = options.chip;
  rocdl.indexBitwidth = 64;
  rocdl.runtime = gpu::amd::Runtime::HIP;
  buildGPUModuleToBinary(pm, createGpuROCDLAttachTarget(target),
                         createConvertGpuOpsToROCDLOps(rocdl), options.format,
                         options.toolkit);
}

void mlir::attnres::buildLowerToROCDLPipeline(
    OpPassManager &pm, const ROCDLPipelineOptions &options) {
  ConvertAttnResToGPUOptions kernels;
  kernels.subgroupSize = 64;
  buildLowerToGPUPipeline(pm, options, kernels, [&](OpPassManager &pm) {
    buildGPUModuleToROCDLBinary(pm, options);
  });
}
