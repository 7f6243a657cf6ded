//===- CPUPipeline.cpp - attnres to LLVM on the host ----------------------===//

#include "attnres/Conversion/Passes.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/Transforms/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

void mlir::attnres::buildLowerToLLVMCPUPipeline(OpPassManager &pm) {
  pm.addPass(createConvertAttnResToLinalg());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());

  bufferization::OneShotBufferizePassOptions bufferization;
  bufferization.bufferizeFunctionBoundaries = true;
  bufferization.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferization));
  bufferization::buildBufferDeallocationPipeline(pm);

  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  // bf16 has no host arithmetic: extf/truncf become integer bit operations.
  arith::ArithExpandOpsPassOptions expand;
  expand.includeBf16 = true;
  pm.addPass(arith::createArithExpandOpsPass(expand));
  pm.addPass(createConvertMathToLLVMPass());
  pm.addPass(createArithToLLVMConversionPass());
  pm.addPass(createConvertIndexToLLVMPass());
  pm.addPass(createFinalizeMemRefToLLVMConversionPass());
  pm.addPass(createConvertControlFlowToLLVMPass());
  pm.addPass(createConvertFuncToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  pm.addPass(createCanonicalizerPass());
}

/// Registers a GPU pipeline whose options are checked before it is built.
template <typename Options>
static void registerGPUPipeline(StringRef name, StringRef description,
                                void (*build)(OpPassManager &,
                                              const Options &)) {
  registerPassPipeline(
      name, description,
      [name, build](OpPassManager &pm, StringRef text,
                    function_ref<LogicalResult(const Twine &)> errorHandler) {
        Options options;
        if (failed(options.parseFromString(text)) ||
            failed(checkGPUPipelineOptions(name, options, errorHandler)))
          return failure();
        build(pm, options);
        return success();
      },
      [](function_ref<void(const detail::PassOptions &)> describe) {
        describe(Options());
      });
}

void mlir::attnres::registerPipelines() {
  PassPipelineRegistration<>(
      "attnres-lower-to-llvm-cpu-pipeline",
      "Lower attnres ops on tensors to the LLVM dialect for the host CPU (the "
      "executable reference): convert-attnres-to-linalg, one-shot "
      "bufferization, loops, LLVM.",
      buildLowerToLLVMCPUPipeline);
  // Registered with their own parsers: some option values are refused.
  registerGPUPipeline<NVVMPipelineOptions>(
      "attnres-lower-to-nvvm-pipeline",
      "Compile the attnres ops of a module to NVIDIA kernels: "
      "attnres-split-sources, attnres-split-reduction, attnres-tile, "
      "attnres-map-to-blocks, convert-attnres-to-gpu, nvvm-attach-target, "
      "convert-gpu-to-nvvm, gpu-module-to-binary (with keep-host=1, "
      "attnres-bufferize-host, attnres-launch-kernels and the host code "
      "lowered too).",
      buildLowerToNVVMPipeline);
  registerGPUPipeline<ROCDLPipelineOptions>(
      "attnres-lower-to-rocdl-pipeline",
      "Compile the attnres ops of a module to AMD kernels: "
      "attnres-split-sources, attnres-split-reduction, attnres-tile, "
      "attnres-map-to-blocks, convert-attnres-to-gpu, rocdl-attach-target, "
      "convert-gpu-to-rocdl, gpu-module-to-binary (with keep-host=1, "
      "attnres-bufferize-host, attnres-launch-kernels and the host code "
      "lowered too).",
      buildLowerToROCDLPipeline);
}
