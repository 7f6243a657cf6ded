//===- Residual.h - the residual of a 16-bit o_pre --------------*- C++ -*-===//
//
// save(o_pre_residual) keeps, next to o_pre rounded to bf16 or f16, a signed
// 4-bit residual per element (the dialect description states the encoding):
//
//   n = clamp(round((exact - x) / ulp(x) * 14), -7, 7)   (ties to even)
//   o_pre ~= x + n * ulp(x) / 14
//   ulp(x) = 2^(e - p), e the exponent of x as an FP32 number, p the
//   fraction bits of the 16-bit type; n = 0 where x is zero, FP32-subnormal,
//   not finite or at least 2^127 in magnitude.
//
// Two residuals share a byte: element 2j in the low four bits, 2j + 1 in the
// high four bits. Every lowering (linalg for the CPU, the GPU kernels) builds
// the encoding from these helpers, so that all of them agree bit for bit.
// They are element-wise arith ops on scalars or vectors alike.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_DIALECT_ATTNRES_UTILS_RESIDUAL_H
#define ATTNRES_DIALECT_ATTNRES_UTILS_RESIDUAL_H

#include "mlir/IR/Builders.h"

#include <utility>

namespace mlir::attnres::residual {

/// The fraction bits p of the 16-bit float type the residual belongs to: 7
/// for bf16, 10 for f16.
int64_t fractionBits(Type element);

/// The residual n of the FP32 value `exact`, whose 16-bit rounding, back in
/// FP32, is `rounded`: its four bits in two's complement (i8, shaped like
/// `exact`, the upper four bits zero).
Value encode(OpBuilder &b, Location loc, Value exact, Value rounded,
             int64_t fractionBits);

/// `rounded` + n * ulp(rounded) / 14 in FP32 (`rounded` itself where n = 0).
Value decode(OpBuilder &b, Location loc, Value rounded, Value residual,
             int64_t fractionBits);

/// The byte holding two residuals as `encode` returns them: `low` in bits
/// 0-3, `high` in bits 4-7.
Value pack(OpBuilder &b, Location loc, Value low, Value high);

/// The two residuals of a byte, sign-extended: {low, high}.
std::pair<Value, Value> unpack(OpBuilder &b, Location loc, Value byte);

} // namespace mlir::attnres::residual

#endif // ATTNRES_DIALECT_ATTNRES_UTILS_RESIDUAL_H
