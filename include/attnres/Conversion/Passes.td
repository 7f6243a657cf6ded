//===- Passes.td - attnres conversion passes ----------------*- tablegen -*-===//

#ifndef ATTNRES_CONVERSION_PASSES_TD
#define ATTNRES_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertAttnResToLinalg : Pass<"convert-attnres-to-linalg"> {
  let summary = "Lower attnres ops to linalg.generic on tensors (the executable reference)";
  let description = [{
    Rewrites every `attnres.forward`, `attnres.backward` and
    `attnres.partition_reduce` into `linalg.generic`, `tensor` and `arith` /
    `math` ops on tensors, computing in FP32 exactly as DESIGN.md states the
    equations: the logit of a source from its RMS-normalized key, a max-shifted
    log-sum-exp, the mixture, the optional output RMS norm, and the gradients
    (with the token reductions in a fixed loop order). Token dimensions are
    flattened to one and restored on the results.

    This lowering favours clarity over speed: it is the oracle the split and
    tiling passes are checked against on the host CPU, not the GPU path.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

#endif // ATTNRES_CONVERSION_PASSES_TD
