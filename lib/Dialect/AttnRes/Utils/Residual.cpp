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

/// The exponent field of the FP32 `value` (i32, other bits cleared), and
/// whether it belongs to a normal number (neither zero/subnormal nor
/// infinity/NaN).
std::pair<Value, Value> exponentField(OpBuilder &b, Location loc, Value value) {
  Type i32 = withElement(value.getType(), b.getI32Type());
  Value bits = arith::BitcastOp::create(b, loc, i32, value);
  Value field = arith::AndIOp::create(b, loc, bits,
                                      intConstant(b, loc, i32, kExponentMask));
  Value nonZero = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, field,
                                        intConstant(b, loc, i32, 0));
  Value finite = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, field,
                                       intConstant(b, loc, i32, kExponentMask));
  return {field, arith::AndIOp::create(b, loc, nonZero, finite)};
}
} // namespace

int64_t residual::fractionBits(Type element) {
  return element.isBF16() ? 7 : 10;
}

Value residual::encode(OpBuilder &b, Location loc, Value exact, Value rounded,
                       int64_t fractionBits) {
  Type type = exact.getType();
  auto [field, normal] = exponentField(b, loc, rounded);
  // 2^e from the exponent field alone; steps = (exact - x) / 2^(e - p) * 14.
  Value powerOfTwo = arith::BitcastOp::create(b, loc, type, field);
  Value difference = arith::SubFOp::create(b, loc, exact, rounded);
  Value steps = arith::MulFOp::create(
      b, loc, arith::DivFOp::create(b, loc, difference, powerOfTwo),
      floatConstant(b, loc, type,
                    kStepsPerUlp * static_cast<double>(1LL << fractionBits)));
  Value zero = floatConstant(b, loc, type, 0.0);
  steps = arith::SelectOp::create(b, loc, normal, steps, zero);
  // Clamp, then round half away from zero (truncation after adding +-0.5):
  // no NaN reaches the conversion.
  Value limit = floatConstant(b, loc, type, kMaxResidual);
  Value negLimit = floatConstant(b, loc, type, -kMaxResidual);
  steps = arith::SelectOp::create(
      b, loc,
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, steps, limit),
      limit, steps);
  steps = arith::SelectOp::create(
      b, loc,
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, steps, negLimit),
      negLimit, steps);
  Value half = arith::SelectOp::create(
      b, loc,
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, steps, zero),
      floatConstant(b, loc, type, -0.5), floatConstant(b, loc, type, 0.5));
  Value rounded32 = arith::AddFOp::create(b, loc, steps, half);
  return arith::FPToSIOp::create(b, loc, withElement(type, b.getI8Type()),
                                 rounded32);
}

Value residual::decode(OpBuilder &b, Location loc, Value rounded,
                       Value residualValue, int64_t fractionBits) {
  Type type = rounded.getType();
  auto [field, normal] = exponentField(b, loc, rounded);
  Value powerOfTwo = arith::BitcastOp::create(b, loc, type, field);
  Value step = arith::MulFOp::create(
      b, loc, powerOfTwo,
      floatConstant(
          b, loc, type,
          1.0 / (kStepsPerUlp * static_cast<double>(1LL << fractionBits))));
  Value steps = arith::SIToFPOp::create(b, loc, type, residualValue);
  Value corrected = arith::AddFOp::create(
      b, loc, rounded, arith::MulFOp::create(b, loc, steps, step));
  return arith::SelectOp::create(b, loc, normal, corrected, rounded);
}

Value residual::pack(OpBuilder &b, Location loc, Value low, Value high) {
  Type type = low.getType();
  Value lowBits =
      arith::AndIOp::create(b, loc, low, intConstant(b, loc, type, 0x0F));
  Value highBits =
      arith::ShLIOp::create(b, loc, high, intConstant(b, loc, type, 4));
  return arith::OrIOp::create(b, loc, lowBits, highBits);
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
