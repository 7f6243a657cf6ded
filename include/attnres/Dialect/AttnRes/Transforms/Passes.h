//===- Passes.h - attnres transformations -----------------------*- C++ -*-===//

#ifndef ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_H
#define ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_H

#include "mlir/Pass/Pass.h"

namespace mlir::attnres {

#define GEN_PASS_DECL
#include "attnres/Dialect/AttnRes/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "attnres/Dialect/AttnRes/Transforms/Passes.h.inc"

} // namespace mlir::attnres

#endif // ATTNRES_DIALECT_ATTNRES_TRANSFORMS_PASSES_H
