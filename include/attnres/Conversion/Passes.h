//===- Passes.h - attnres conversion passes ---------------------*- C++ -*-===//

#ifndef ATTNRES_CONVERSION_PASSES_H
#define ATTNRES_CONVERSION_PASSES_H

#include "mlir/Pass/Pass.h"

namespace mlir {
class RewritePatternSet;
} // namespace mlir

namespace mlir::attnres {

#define GEN_PASS_DECL
#include "attnres/Conversion/Passes.h.inc"

/// Patterns lowering the three attnres ops to linalg.generic on tensors.
void populateAttnResToLinalgPatterns(RewritePatternSet &patterns);

#define GEN_PASS_REGISTRATION
#include "attnres/Conversion/Passes.h.inc"

} // namespace mlir::attnres

#endif // ATTNRES_CONVERSION_PASSES_H
