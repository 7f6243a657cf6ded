//===- FloatArithmetic.cpp - FP32 arithmetic of the lowerings -------------===//

#include "attnres/Dialect/AttnRes/Utils/FloatArithmetic.h"

#include "mlir/Dialect/Math/IR/Math.h"

#include <cmath>

using namespace mlir;
using namespace mlir::attnres;

arith::FastMathFlags FloatArithmetic::flags() const {
  return mode == Mode::Fused ? arith::FastMathFlags::contract
                             : arith::FastMathFlags::none;
}

Value FloatArithmetic::constF32(double value) {
  return arith::ConstantOp::create(b, loc, b.getF32Type(),
                                   b.getF32FloatAttr(value));
}

Value FloatArithmetic::add(Value x, Value y) {
  return arith::AddFOp::create(b, loc, x, y, flags());
}
Value FloatArithmetic::sub(Value x, Value y) {
  return arith::SubFOp::create(b, loc, x, y, flags());
}
Value FloatArithmetic::mul(Value x, Value y) {
  return arith::MulFOp::create(b, loc, x, y, flags());
}
// A quotient never fuses with a sum: no flag in either mode.
Value FloatArithmetic::div(Value x, Value y) {
  return arith::DivFOp::create(b, loc, x, y);
}
Value FloatArithmetic::maximum(Value x, Value y) {
  return arith::MaximumFOp::create(b, loc, x, y);
}
Value FloatArithmetic::select(Value condition, Value x, Value y) {
  return arith::SelectOp::create(b, loc, condition, x, y);
}
Value FloatArithmetic::compare(arith::CmpFPredicate predicate, Value x,
                               Value y) {
  return arith::CmpFOp::create(b, loc, predicate, x, y);
}

Value FloatArithmetic::exp(Value x) {
  if (mode == Mode::Exact)
    return math::ExpOp::create(b, loc, x);
  return math::Exp2Op::create(b, loc, mul(x, constF32(M_LOG2E)));
}
Value FloatArithmetic::log(Value x) {
  if (mode == Mode::Exact)
    return math::LogOp::create(b, loc, x);
  return mul(math::Log2Op::create(b, loc, x), constF32(M_LN2));
}
Value FloatArithmetic::rsqrt(Value x) {
  return math::RsqrtOp::create(b, loc, x);
}
