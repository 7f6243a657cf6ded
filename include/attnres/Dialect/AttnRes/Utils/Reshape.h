//===- Reshape.h - token-dimension reshapes ---------------------*- C++ -*-===//
//
// attnres ops take any number of token dimensions; lowerings and
// transformations work on exactly one. These helpers merge the token
// dimensions of a tensor into one and restore them.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_DIALECT_ATTNRES_UTILS_RESHAPE_H
#define ATTNRES_DIALECT_ATTNRES_UTILS_RESHAPE_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"

namespace mlir::attnres {

/// Merges dimensions [start, start + count) of the tensor `value` into one
/// (count == 0 inserts a unit dimension at `start`; count == 1 is a no-op).
Value flattenDims(OpBuilder &b, Location loc, Value value, int64_t start,
                  int64_t count);

/// The inverse of flattenDims: dimension `start` of `value` becomes the
/// dimensions `sizes`, and the result is cast to `type`.
Value unflattenDims(OpBuilder &b, Location loc, Value value, int64_t start,
                    ArrayRef<OpFoldResult> sizes, RankedTensorType type);

} // namespace mlir::attnres

#endif // ATTNRES_DIALECT_ATTNRES_UTILS_RESHAPE_H
