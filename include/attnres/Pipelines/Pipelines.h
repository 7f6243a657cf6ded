//===- Pipelines.h - attnres pass pipelines ---------------------*- C++ -*-===//

#ifndef ATTNRES_PIPELINES_PIPELINES_H
#define ATTNRES_PIPELINES_PIPELINES_H

#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace mlir::attnres {

/// The default `toolkit` of the NVVM pipeline: the CUDA toolkit the project
/// was configured with (ATTNRES_CUDA_TOOLKIT, /usr/local/cuda by default).
std::string defaultCudaToolkit();
/// The default `toolkit` of the ROCDL pipeline, found from the program or
/// library this code is part of: `lib/attnres/rocm-toolkit` of an installed
/// prefix or the build tree's `rocm-toolkit` folder; empty (the ROCDL
/// target's own search) when neither is there.
std::string defaultRocmToolkit();

/// The options both GPU pipelines share: whether the host functions are kept
/// and, for them, the decomposition the split passes write.
template <typename Derived>
struct GPUPipelineOptions : public PassPipelineOptions<Derived> {
  mlir::detail::PassOptions::Option<bool> keepHost{
      *this, "keep-host",
      llvm::cl::desc(
          "Keep the functions: each attnres op becomes the launches of "
          "its kernels (on the grids the split and tile passes' fixed "
          "counts and tile sizes give, or sized at run time), and the "
          "host code is lowered to the LLVM dialect calling the "
          "mgpu* functions, ready for mlir-translate"),
      llvm::cl::init(false)};
  mlir::detail::PassOptions::Option<int64_t> forwardPartitions{
      *this, "forward-partitions",
      llvm::cl::desc("With keep-host: partitions of the sources every "
                     "forward splits into (attnres-split-sources' "
                     "partitions); 0: the runtime's rule, computed at "
                     "run time from the token count and the device"),
      llvm::cl::init(0)};
  mlir::detail::PassOptions::Option<int64_t> backwardBlocks{
      *this, "backward-blocks",
      llvm::cl::desc("With keep-host: blocks of tokens of every backward "
                     "(attnres-split-reduction's blocks); 0: the "
                     "runtime's rule, computed at run time from the token "
                     "count and the device"),
      llvm::cl::init(0)};
  mlir::detail::PassOptions::ListOption<int64_t> tileSizes{
      *this, "tile-sizes",
      llvm::cl::desc("With keep-host: attnres-tile's tile sizes (tokens, "
                     "outermost token dimension first; all but the last "
                     "tiled one must be 1); a block of a tiled forward's or "
                     "merge's kernels covers one tile. A multi-query "
                     "forward's merge has the queries as its first token "
                     "dimension")};
  mlir::detail::PassOptions::Option<std::string> transformLibrary{
      *this, "transform-library",
      llvm::cl::desc("With keep-host: a transform dialect file whose "
                     "@__transform_main runs in place of attnres-tile (its "
                     "transform.structured.tile_using_forall loops are "
                     "launched as attnres-tile's are)"),
      llvm::cl::init("")};
  mlir::detail::PassOptions::Option<int64_t> backwardPartitions{
      *this, "backward-partitions",
      llvm::cl::desc("With keep-host: partitions of the sources of every "
                     "backward (0: the runtime's rule)"),
      llvm::cl::init(0)};
};

/// Options of attnres-lower-to-nvvm-pipeline (named after upstream's
/// GPUToNVVMPipelineOptions).
struct NVVMPipelineOptions : public GPUPipelineOptions<NVVMPipelineOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("Target chip"), llvm::cl::init("sm_90")};
  PassOptions::Option<std::string> features{
      *this, "features",
      llvm::cl::desc("PTX features (sm_90 and later need +ptx80)"),
      llvm::cl::init("+ptx80")};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("gpu-module-to-binary format: isa (PTX), bin (cubin) "
                     "or fatbin"),
      llvm::cl::init("bin")};
  PassOptions::Option<int> optLevel{*this, "opt-level",
                                    llvm::cl::desc("LLVM optimization level"),
                                    llvm::cl::init(3)};
  PassOptions::Option<std::string> toolkit{
      *this, "toolkit", llvm::cl::desc("CUDA toolkit (libdevice, ptxas)"),
      llvm::cl::init(defaultCudaToolkit())};
};

/// Options of attnres-lower-to-rocdl-pipeline.
struct ROCDLPipelineOptions : public GPUPipelineOptions<ROCDLPipelineOptions> {
  PassOptions::Option<std::string> chip{
      *this, "chip", llvm::cl::desc("Target chip (gfx942, gfx950, ...)"),
      llvm::cl::init("gfx942")};
  PassOptions::Option<std::string> features{
      *this, "features", llvm::cl::desc("Target features"), llvm::cl::init("")};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("gpu-module-to-binary format: isa (AMDGPU assembly) or "
                     "bin (hsaco)"),
      llvm::cl::init("bin")};
  PassOptions::Option<int> optLevel{*this, "opt-level",
                                    llvm::cl::desc("LLVM optimization level"),
                                    llvm::cl::init(3)};
  PassOptions::Option<std::string> toolkit{
      *this, "toolkit",
      llvm::cl::desc("ROCm-style toolkit folder: llvm/bin/ld.lld and "
                     "amdgcn/bitcode"),
      llvm::cl::init(defaultRocmToolkit())};
};

/// The number of an NVIDIA chip (90 for sm_90a, 100 for sm_100f), 0 when
/// `chip` names none.
unsigned nvidiaChipNumber(llvm::StringRef chip);

/// Whether an NVIDIA chip has asynchronous copies from global to shared
/// memory (cp.async, sm_80 and later), which the staged kernels use.
bool hasAsyncCopies(llvm::StringRef chip);

/// Whether an NVIDIA chip has thread-block clusters with distributed shared
/// memory (sm_90 and later), which the clustered forward uses.
bool hasClusters(llvm::StringRef chip);

/// Refuses option values a GPU pipeline cannot honour (fixed counts without
/// keep-host, negative counts), through `errorHandler`; `pipeline` names it.
template <typename Derived>
LogicalResult checkGPUPipelineOptions(
    llvm::StringRef pipeline, const GPUPipelineOptions<Derived> &options,
    function_ref<LogicalResult(const Twine &)> errorHandler);
/// The GPU pipelines' first stage, which the bundle writer runs too:
/// attnres-split-sources, attnres-split-reduction, attnres-tile (or the
/// transform script `transformLibrary` in its place) and
/// attnres-map-to-blocks. Counts of 0 are `auto`, which leaves every op
/// whole for its kernels to be sized at run time; fixed counts and tile
/// sizes write the decomposition into the IR.
void buildDecompositionPasses(OpPassManager &pm, int64_t forwardPartitions,
                              int64_t backwardBlocks,
                              llvm::ArrayRef<int64_t> tileSizes,
                              llvm::StringRef transformLibrary);
/// attnres ops -> the decomposition passes -> kernels
/// (convert-attnres-to-gpu) -> NVVM -> binary; with keep-host, the host code
/// lowered too.
void buildLowerToNVVMPipeline(OpPassManager &pm,
                              const NVVMPipelineOptions &options);
/// The part after convert-attnres-to-gpu.
void buildGPUModuleToNVVMBinary(OpPassManager &pm,
                                const NVVMPipelineOptions &options);

/// attnres ops -> the decomposition passes -> kernels -> ROCDL -> binary;
/// with keep-host, as the NVVM pipeline.
void buildLowerToROCDLPipeline(OpPassManager &pm,
                               const ROCDLPipelineOptions &options);
void buildGPUModuleToROCDLBinary(OpPassManager &pm,
                                 const ROCDLPipelineOptions &options);

/// attnres ops on tensors -> LLVM dialect for the host CPU: the executable
/// reference (convert-attnres-to-linalg, bufferization, loops, LLVM).
/// Functions marked `llvm.emit_c_interface` get C wrappers.
void buildLowerToLLVMCPUPipeline(OpPassManager &pm);

/// Registers every attnres pipeline with the global pass registry.
void registerPipelines();

} // namespace mlir::attnres

#endif // ATTNRES_PIPELINES_PIPELINES_H
