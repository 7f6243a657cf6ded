//===- Pipelines.h - attnres pass pipelines ---------------------*- C++ -*-===//

#ifndef ATTNRES_PIPELINES_PIPELINES_H
#define ATTNRES_PIPELINES_PIPELINES_H

namespace mlir {
class OpPassManager;
} // namespace mlir

namespace mlir::attnres {

/// attnres ops on tensors -> LLVM dialect for the host CPU: the executable
/// reference (convert-attnres-to-linalg, bufferization, loops, LLVM).
/// Functions marked `llvm.emit_c_interface` get C wrappers.
void buildLowerToLLVMCPUPipeline(OpPassManager &pm);

/// Registers every attnres pipeline with the global pass registry.
void registerPipelines();

} // namespace mlir::attnres

#endif // ATTNRES_PIPELINES_PIPELINES_H
