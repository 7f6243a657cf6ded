//===- FloatArithmetic.h - FP32 arithmetic of the lowerings -----*- C++ -*-===//
//
// The FP32 arithmetic both lowerings of the attnres ops build (on scalars or
// vectors; constF32, and exp and log in Fused mode, on scalars), in one of
// two modes:
//
//   Exact (the linalg reference): each operation rounds on its own, and e^x
//     and ln x are math.exp and math.log, so that the reference follows the
//     equations operation by operation.
//   Fused (the GPU kernels): a product feeding a sum may fuse into one FMA
//     (arith fastmath<contract>: one rounding instead of two, half the
//     instructions of the streaming loops), and e^x and ln x go through
//     exp2 and log2, which both GPU backends have natively.
//
// The kernels' results are checked against the reference within the
// tolerances the tests state; the difference between the modes is why they
// are not bit-identical.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_DIALECT_ATTNRES_UTILS_FLOATARITHMETIC_H
#define ATTNRES_DIALECT_ATTNRES_UTILS_FLOATARITHMETIC_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"

namespace mlir::attnres {

class FloatArithmetic {
public:
  enum class Mode { Exact, Fused };

  FloatArithmetic(OpBuilder &builder, Location loc, Mode mode)
      : b(builder), loc(loc), mode(mode) {}

  /// An FP32 constant.
  Value constF32(double value);

  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value div(Value x, Value y);
  Value maximum(Value x, Value y);
  Value select(Value condition, Value x, Value y);
  Value compare(arith::CmpFPredicate predicate, Value x, Value y);
  /// e^x and ln x of an FP32 scalar (Fused: through exp2 / log2).
  Value exp(Value x);
  Value log(Value x);
  Value rsqrt(Value x);

  OpBuilder &b;
  Location loc;

private:
  arith::FastMathFlags flags() const;
  Mode mode;
};

} // namespace mlir::attnres

#endif // ATTNRES_DIALECT_ATTNRES_UTILS_FLOATARITHMETIC_H
