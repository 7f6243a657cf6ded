//===- InitAll.h - register everything attnres tools use --------*- C++ -*-===//
//
// The one place that says which dialects, extensions and passes an attnres
// tool knows. Every tool (attnres-opt, the C API, test drivers) calls these,
// so that they all accept the same IR.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_INITALL_H
#define ATTNRES_INITALL_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace mlir::attnres {

/// Adds the attnres dialect, the upstream dialects the attnres pipelines
/// produce (func, arith, math, tensor, linalg, scf, memref, vector,
/// bufferization, gpu, nvvm, rocdl, llvm, ...) and their interface models and
/// LLVM IR translations.
void registerAllDialects(DialectRegistry &registry);

/// Registers the attnres passes and pipelines, and the upstream passes, in
/// the global pass registry (idempotent).
void registerAllPasses();

/// Registers the attnres passes and pipelines alone: for a tool that has
/// registered the upstream ones itself (the mlir-opt plugin).
void registerAttnResPasses();

} // namespace mlir::attnres

#endif // ATTNRES_INITALL_H
