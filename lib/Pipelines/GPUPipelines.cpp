//===- GPUPipelines.cpp - attnres to NVVM and ROCDL binaries --------------===//
//
// Composed from upstream passes: the kernels of convert-attnres-to-gpu are
// lowered with convert-gpu-to-nvvm / convert-gpu-to-rocdl and serialized by
// gpu-module-to-binary. Math lowers to libdevice (NVVM, linked from the CUDA
// toolkit) or OCML (ROCDL, from Debian's rocm-device-libs).
//
//===----------------------------------------------------------------------===//

#include "attnres/Conversion/Passes.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;

static void addDeviceCleanup(OpPassManager &device) {
  device.addPass(createCanonicalizerPass());
  device.addPass(createCSEPass());
  device.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::attnres::buildGPUModuleToNVVMBinary(
    OpPassManager &pm, const NVVMPipelineOptions &options) {
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  pm.addPass(createGpuNVVMAttachTarget(target));
  OpPassManager &device = pm.nest<gpu::GPUModuleOp>();
  device.addPass(createConvertVectorToLLVMPass());
  device.addPass(createSCFToControlFlowPass());
  ConvertGpuOpsToNVVMOpsOptions nvvm;
  nvvm.indexBitwidth = 64;
  device.addPass(createConvertGpuOpsToNVVMOps(nvvm));
  addDeviceCleanup(device);
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.toolkitPath = options.toolkit;
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::attnres::buildLowerToNVVMPipeline(
    OpPassManager &pm, const NVVMPipelineOptions &options) {
  ConvertAttnResToGPUOptions kernels;
  kernels.subgroupSize = 32;
  pm.addPass(createConvertAttnResToGPU(kernels));
  buildGPUModuleToNVVMBinary(pm, options);
}

void mlir::attnres::buildGPUModuleToROCDLBinary(
    OpPassManager &pm, const ROCDLPipelineOptions &options) {
  GpuROCDLAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  pm.addPass(createGpuROCDLAttachTarget(target));
  OpPassManager &device = pm.nest<gpu::GPUModuleOp>();
  device.addPass(createConvertVectorToLLVMPass());
  device.addPass(createSCFToControlFlowPass());
  ConvertGpuOpsToROCDLOpsOptions rocdl;
  rocdl.chipset = options.chip;
  rocdl.indexBitwidth = 64;
  rocdl.runtime = gpu::amd::Runtime::HIP;
  device.addPass(createConvertGpuOpsToROCDLOps(rocdl));
  addDeviceCleanup(device);
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  binary.toolkitPath = options.toolkit;
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::attnres::buildLowerToROCDLPipeline(
    OpPassManager &pm, const ROCDLPipelineOptions &options) {
  ConvertAttnResToGPUOptions kernels;
  kernels.subgroupSize = 64;
  pm.addPass(createConvertAttnResToGPU(kernels));
  buildGPUModuleToROCDLBinary(pm, options);
}
