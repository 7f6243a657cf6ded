//===- Residual.cpp - the residual of a 16-bit o_pre ----------------------===//

#include "attnres/Dialect/AttnRes/Utils/Residual.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mlir::attnres;

namespace {
/// The bits of an FP32 exponent field.
constexpr int64_t kExponentMask = 0x7F800000;
/// The largest residual magnitude, and the steps per ulp (2 * 7).
constexpr int64_t kMaxResidual = 7;
constexpr double kStepsPerUlp = 14.0;

/// `type` (scalar or vector) with `element` as its element type.
Type withElement(Type type, Type element) {
  if (auto vector = dyn_cast<VectorType>(type))
    return vector.clone(element);
  return element;
}

/// A constant of `type` (scalar or vector splat).
Value constant(OpBuilder &b, Location loc, Type type, TypedAttr scalar) {
  if (auto vector = dyn_cast<VectorType>(type))
    return arith::ConstantOp::create(b, loc, vector,
                                     SplatElementsAttr::get(vector, scalar));
  return arith::ConstantOp::create(b, loc, type, scalar);
}
Value floatConstant(OpBuilder &b, Location loc, Type type, double value) {
  return constant(b, loc, type, b.getF32FloatAttr(value));
}
Value intConstant(OpBuilder &b, Location loc, Type type, int64_t value) {
  Type element = getElementTypeOrSelf(type);
  return constant(b, loc, type, b.getIntegerAttr(element, value));
}

/// The exponent field of the FP32 `value` (i32, other bits cleared): 2^e as
/// bits, 0 for zero and subnormals, all ones for infinity and NaN.
Value exponentField(OpBuilder &b, Location loc, Value value) {
  Type i32 = withElement(value.getType(), b.getI32Type());
  Value bits = arith::BitcastOp::create(b, loc, i32, value);
  return arith::AndIOp::create(b, loc, bits,
                               intConstant(b, loc, i32, kExponentMask));
}
} // namespace

int64_t residual::fractionBits(Type element) {
  return element.isBF16() ? 7 : 10;
}

Value residual::encode(OpBuilder &b, Location loc, Value exact, Value rounded,
                       int64_t fractionBits) {
  Type type = exact.getType();
  Type i32 = withElement(type, b.getI32Type());
  Value field = exponentField(b, loc, rounded);
  // Normal (neither zero/subnormal nor infinity/NaN): field - 2^23 below
  // 254 * 2^23, unsigned, in two ops.
  Value normal = arith::CmpIOp::create(
      b, loc, arith::CmpIPredicate::ult,
      arith::SubIOp::create(b, loc, field,
                            intConstant(b, loc, i32, 0x00800000)),
      intConstant(b, loc, i32, 0x7F000000));
  // steps = (exact - x) / 2^(e - p) * 14, the division by 2^e a product with
  // 2^-e, whose exponent field is 254 - that of 2^e: exact, and no divide
  // sequence per element on the GPU. For |x| >= 2^127 that is 0 (so n = 0).
  Value reciprocal = arith::BitcastOp::create(
      b, loc, type,
      arith::SubIOp::create(b, loc, intConstant(b, loc, i32, 0x7F000000),
                            field));
  Value difference = arith::SubFOp::create(b, loc, exact, rounded);
  Value steps = arith::MulFOp::create(
      b, loc, arith::MulFOp::create(b, loc, difference, reciprocal),
      floatConstant(b, loc, type,
                    kStepsPerUlp * static_cast<double>(1LL << fractionBits)));
  steps = arith::SelectOp::create(b, loc, normal, steps,
                                  floatConstant(b, loc, type, 0.0));
  // x is the 16-bit value nearest to `exact`, so |exact - x| <= ulp / 2 and
  // |steps| <= 7, except below an f16 subnormal's ulp: clamp there only.
  if (fractionBits != 7) {
    Value limit = floatConstant(b, loc, type, kMaxResidual);
    Value negLimit = floatConstant(b, loc, type, -kMaxResidual);
    steps = arith::SelectOp::create(
        b, loc,
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, steps, limit),
        limit, steps);
    steps = arith::SelectOp::create(
        b, loc,
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, steps,
                              negLimit),
        negLimit, steps);
  }
  // Round to nearest, ties to even, by adding 1.5 * 2^23: the sum's last
  // bits are the rounded steps in two's complement (an add and an and, not
  // a conversion).
  Value shiftedSteps = arith::AddFOp::create(
      b, loc, steps, floatConstant(b, loc, type, 12582912.0));
  Value nibble = arith::AndIOp::create(
      b, loc, arith::BitcastOp::create(b, loc, i32, shiftedSteps),
      intConstant(b, loc, i32, 0x0F));
  return arith::TruncIOp::create(b, loc, withElement(type, b.getI8Type()),
                                 nibble);
}

Value residual::decode(OpBuilder &b, Location loc, Value rounded,
                       Value residualValue, int64_t fractionBits) {
  Type type = rounded.getType();
  Type i32 = withElement(type, b.getI32Type());
  // The step ulp / 14 from the exponent field: 0 for a zero or subnormal x
  // (field 0), which leaves x as it is. Only a non-finite x needs a select
  // (0 * inf is NaN).
  Value field = exponentField(b, loc, rounded);
  Value finite = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, field,
                                       intConstant(b, loc, i32, kExponentMask));
  Value step = arith::MulFOp::create(
      b, loc, arith::BitcastOp::create(b, loc, type, field),
      floatConstant(
          b, loc, type,
          1.0 / (kStepsPerUlp * static_cast<double>(1LL << fractionBits))));
  Value steps = arith::SIToFPOp::create(b, loc, type, residualValue);
  // One fused multiply-add where the target has it.
  auto contract = arith::FastMathFlags::contract;
  Value corrected = arith::AddFOp::create(
      b, loc, arith::MulFOp::create(b, loc, steps, step, contract), rounded,
      contract);
  return arith::SelectOp::create(b, loc, finite, corrected, rounded);
}

Value residual::pack(OpBuilder &b, Location loc, Value low, Value high) {
  Type type = low.getType();
  Value highBits =
      arith::ShLIOp::create(b, loc, high, intConstant(b, loc, type, 4));
  return arith::OrIOp::create(b, loc, low, highBits);
}

std::pair<Value, Value> residual::unpack(OpBuilder &b, Location loc,
                                         Value byte) {
  Type type = byte.getType();
  Value four = intConstant(b, loc, type, 4);
  Value low = arith::ShRSIOp::create(
      b, loc, arith::ShLIOp::create(b, loc, byte, four), four);
  Value high = arith::ShRSIOp::create(b, loc, byte, four);
  return {low, high};
}
