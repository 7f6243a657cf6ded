//===- AttnResOps.h - attnres operations ------------------------*- C++ -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_H
#define ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_H

#include "attnres/Dialect/AttnRes/IR/AttnResDialect.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Interfaces/TilingInterface.h"

#include "attnres/Dialect/AttnRes/IR/AttnResEnums.h.inc"

#define GET_OP_CLASSES
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h.inc"

namespace mlir::attnres {

/// The largest number of queries one op may carry (docs/Math.md section 1).
constexpr int64_t kMaxQueries = 16;
/// The most sources (L) one op may read, and partitions (P) one
/// partition_reduce may merge. The kernels walk the sources in a loop, so
/// this bounds the size of the IR and of the launch tables, not speed.
constexpr int64_t kMaxSources = 4096;
/// The widest row (D) an op may have: the generated kernels hold a row's
/// share per thread across a block of at most 1024 threads.
constexpr int64_t kMaxWidth = 65536;

/// True for the element types a value tensor may have: bf16, f16, f32.
bool isSupportedValueType(Type type);

/// True for the attnres ops on buffers (attnres.forward_into, ...).
bool isOpOnBuffers(Operation *op);

/// The layouts the ops on buffers take: strided, with stride 1 in the last
/// dimension (each row's elements adjacent), at any offset.
bool hasContiguousRows(MemRefType type);

/// An error naming `pass` at the first attnres op on buffers under `root`
/// (attnres.forward_into, ...): `pass` lowers the ops on tensors, which
/// bufferization turns into those.
LogicalResult refuseOpsOnBuffers(Operation *root, StringRef pass);

} // namespace mlir::attnres

#endif // ATTNRES_DIALECT_ATTNRES_IR_ATTNRESOPS_H
