//===- AttnResToLinalg.cpp - attnres ops to linalg.generic ----------------===//
//
// The executable reference: each attnres op becomes a short sequence of
// linalg.generic ops on FP32 tensors that follows docs/Math.md equation by
// equation. Inside, every tensor is in a canonical layout:
//
//   sources V [L, N, D]   key T [L, N, R]   query Q [M, R]   g [R]
//   output-norm weight h [Mh, D] (Mh = 1 or M)   per-query results [M, N, ...]
//
// where N is the product of the token dimensions. The layout is restored on
// the results. Every reduction is a linalg reduction dimension, so when lowered
// to loops the summation order is fixed: results are deterministic.
//
//===----------------------------------------------------------------------===//

#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"
#include "attnres/Dialect/AttnRes/Utils/FloatArithmetic.h"
#include "attnres/Dialect/AttnRes/Utils/Reshape.h"
#include "attnres/Dialect/AttnRes/Utils/Residual.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineMap.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Transforms/DialectConversion.h"

#include <limits>

namespace mlir::attnres {
#define GEN_PASS_DEF_CONVERTATTNRESTOLINALG
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;

namespace {

/// A linalg.generic body: the result from the FP32 block arguments, built
/// with the reference's arithmetic.
using Body = function_ref<Value(FloatArithmetic &, ValueRange)>;
constexpr utils::IteratorType kPar = utils::IteratorType::parallel;
constexpr utils::IteratorType kRed = utils::IteratorType::reduction;

/// Builds FP32 tensor computations at one location.
class Emitter {
public:
  Emitter(OpBuilder &builder, Location loc)
      : b(builder), loc(loc), f32(b.getF32Type()) {}

  OpBuilder &b;
  Location loc;
  Type f32;

  static double inf() { return std::numeric_limits<double>::infinity(); }

  /// A tensor of `shape` filled with `value` (the init of a reduction).
  Value filled(ArrayRef<OpFoldResult> shape, double value) {
    Value empty = tensor::EmptyOp::create(b, loc, shape, f32);
    Value fill =
        FloatArithmetic(b, loc, FloatArithmetic::Mode::Exact).constF32(value);
    return linalg::FillOp::create(b, loc, fill, empty).getResult(0);
  }
  Value empty(ArrayRef<OpFoldResult> shape) {
    return tensor::EmptyOp::create(b, loc, shape, f32);
  }

  /// The affine map (d0, ..., d{numDims-1}) -> (d{dims[0]}, ...).
  AffineMap map(unsigned numDims, ArrayRef<unsigned> dims) {
    SmallVector<AffineExpr> exprs;
    for (unsigned dim : dims)
      exprs.push_back(b.getAffineDimExpr(dim));
    return AffineMap::get(numDims, 0, exprs, b.getContext());
  }

  /// One linalg.generic with FP32 block arguments (inputs of other element
  /// types are extended first) and one FP32 result written into `init`.
  Value generic(ArrayRef<Value> inputs, ArrayRef<AffineMap> inputMaps,
                Value init, AffineMap initMap,
                ArrayRef<utils::IteratorType> iterators, Body body) {
    SmallVector<AffineMap> maps(inputMaps);
    maps.push_back(initMap);
    auto op = linalg::GenericOp::create(
        b, loc, TypeRange{init.getType()}, inputs, ValueRange{init}, maps,
        iterators, [&](OpBuilder &nested, Location nestedLoc, ValueRange args) {
          SmallVector<Value> widened;
          for (Value arg : args)
            widened.push_back(
                arg.getType() == f32
                    ? arg
                    : arith::ExtFOp::create(nested, nestedLoc, f32, arg)
                          .getResult());
          FloatArithmetic arithmetic(nested, nestedLoc,
                                     FloatArithmetic::Mode::Exact);
          Value result = body(arithmetic, widened);
          linalg::YieldOp::create(nested, nestedLoc, result);
        });
    return op.getResult(0);
  }

  /// Converts an FP32 tensor to `elementType` (truncation of each element).
  Value toElementType(Value value, Type elementType) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getElementType() == elementType)
      return value;
    auto target = type.clone(elementType);
    Value init = tensor::EmptyOp::create(
        b, loc, tensor::getMixedSizes(b, loc, value), elementType);
    unsigned rank = type.getRank();
    SmallVector<unsigned> identity =
        llvm::to_vector(llvm::seq<unsigned>(0, rank));
    SmallVector<utils::IteratorType> iterators(rank, kPar);
    SmallVector<AffineMap> maps{map(rank, identity), map(rank, identity)};
    auto op = linalg::GenericOp::create(
        b, loc, TypeRange{target}, ValueRange{value}, ValueRange{init}, maps,
        iterators, [&](OpBuilder &nested, Location nestedLoc, ValueRange args) {
          Value narrowed =
              arith::TruncFOp::create(nested, nestedLoc, elementType, args[0]);
          linalg::YieldOp::create(nested, nestedLoc, narrowed);
        });
    return op.getResult(0);
  }

  /// Converts a tensor of any float type to FP32.
  Value toF32(Value value) {
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getElementType() == f32)
      return value;
    unsigned rank = type.getRank();
    SmallVector<unsigned> identity =
        llvm::to_vector(llvm::seq<unsigned>(0, rank));
    SmallVector<utils::IteratorType> iterators(rank, kPar);
    return generic({value}, {map(rank, identity)},
                   empty(tensor::getMixedSizes(b, loc, value)),
                   map(rank, identity), iterators,
                   [](FloatArithmetic &, ValueRange args) { return args[0]; });
  }
};

/// What forward and backward both derive from the sources and the query.
/// A list of per-source tensors [T..., D], or one packed [L, T..., D], as one
/// [L, N, D] tensor: the packed one with its token dimensions merged, the
/// list copied side by side (one concatenation, not a chain of insertions:
/// bufferization analysis time grows quickly with the length of such
/// chains).
Value asLND(OpBuilder &b, Location loc, ValueRange values, bool packed,
            int64_t numTokenDims) {
  if (packed)
    return flattenDims(b, loc, values.front(), 1, numTokenDims);
  SmallVector<Value> rows;
  for (Value value : values)
    rows.push_back(
        flattenDims(b, loc, flattenDims(b, loc, value, 0, numTokenDims), 0, 0));
  return tensor::ConcatOp::create(b, loc, /*dim=*/0, rows);
}

struct SourceTerms {
  int64_t numSources, width, rank, numQueries;
  SmallVector<OpFoldResult> tokenSizes; // T...
  OpFoldResult numTokens;               // N
  Value sources;                        // V [L, N, D], storage type
  Value key;                            // T [L, N, R], storage type
  Value query;                          // Q [M, R] f32
  Value keyNormWeight;                  // g [R] f32, or null
  Value keyQuery;                       // a = g * q [M, R] f32
  Value keyRho;                         // rho [L, N] f32
  Value ell;                            // rho * <t, a> [M, L, N] f32
};

template <typename OpT> SourceTerms computeSourceTerms(Emitter &e, OpT op) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  SourceTerms terms;
  terms.numSources = op.getNumSourceValues();
  terms.width = op.getWidth();
  terms.rank = op.getRank();
  terms.numQueries = op.getNumQueries();
  int64_t L = terms.numSources, D = terms.width, R = terms.rank,
          M = terms.numQueries;
  int64_t numTokenDims = op.getSourceType().getRank() - 1;

  // V [L, N, D]: the packed tensor with its token dimensions merged, or the
  // list of sources copied side by side.
  Value first = op.getSources().front();
  SmallVector<OpFoldResult> firstSizes = tensor::getMixedSizes(b, loc, first);
  terms.tokenSizes.assign(firstSizes.begin() + (op.getPacked() ? 1 : 0),
                          firstSizes.end() - 1);
  terms.sources = asLND(b, loc, op.getSources(), op.getPacked(), numTokenDims);
  terms.numTokens = tensor::getMixedSize(b, loc, terms.sources, 1);
  OpFoldResult N = terms.numTokens;
  auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };

  // The key is the last R coordinates of every source.
  terms.key = tensor::ExtractSliceOp::create(
      b, loc, terms.sources, ArrayRef<OpFoldResult>{idx(0), idx(0), idx(D - R)},
      ArrayRef<OpFoldResult>{idx(L), N, idx(R)},
      ArrayRef<OpFoldResult>{idx(1), idx(1), idx(1)});

  Value query = e.toF32(op.getQuery());
  if (!op.isMultiQuery())
    query = flattenDims(b, loc, query, 0, 0);
  terms.query = query;
  if (Value g = op.getKeyNormWeight())
    terms.keyNormWeight = e.toF32(g);

  // a[m, r] = g[r] * q[m, r]
  if (terms.keyNormWeight) {
    terms.keyQuery = e.generic(
        {terms.query, terms.keyNormWeight}, {e.map(2, {0, 1}), e.map(2, {1})},
        e.empty({idx(M), idx(R)}), e.map(2, {0, 1}), {kPar, kPar},
        [&](FloatArithmetic &f, ValueRange x) { return f.mul(x[0], x[1]); });
  } else {
    terms.keyQuery = terms.query;
  }

  // rho[l, n] = 1 / sqrt(mean_r t^2 + eps)
  Value sumSquares =
      e.generic({terms.key}, {e.map(3, {0, 1, 2})}, e.filled({idx(L), N}, 0.0),
                e.map(3, {0, 1}), {kPar, kPar, kRed},
                [&](FloatArithmetic &f, ValueRange x) {
                  return f.add(x[1], f.mul(x[0], x[0]));
                });
  double eps = op.getEps().convertToDouble();
  terms.keyRho = e.generic(
      {sumSquares}, {e.map(2, {0, 1})}, e.empty({idx(L), N}), e.map(2, {0, 1}),
      {kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
        Value mean = f.div(x[0], f.constF32(static_cast<double>(R)));
        return f.rsqrt(f.add(mean, f.constF32(eps)));
      });

  // ell[m, l, n] = rho[l, n] * sum_r t[l, n, r] * a[m, r]
  Value dot = e.generic(
      {terms.key, terms.keyQuery}, {e.map(4, {1, 2, 3}), e.map(4, {0, 3})},
      e.filled({idx(M), idx(L), N}, 0.0), e.map(4, {0, 1, 2}),
      {kPar, kPar, kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
        return f.add(x[2], f.mul(x[0], x[1]));
      });
  terms.ell = e.generic(
      {dot, terms.keyRho}, {e.map(3, {0, 1, 2}), e.map(3, {1, 2})},
      e.empty({idx(M), idx(L), N}), e.map(3, {0, 1, 2}), {kPar, kPar, kPar},
      [&](FloatArithmetic &f, ValueRange x) { return f.mul(x[0], x[1]); });
  return terms;
}

/// p[m, l, n] = exp(scale * ell[m, l, n] - lse[m, n]); 1 with one source,
/// whatever the rounding: the backward's lse comes from the forward, whose
/// logit may differ from the one recomputed here in its last bits, and
/// p = exp(tiny) would leave dq, dg and dv - do not exactly zero.
Value softmaxWeights(Emitter &e, const SourceTerms &terms, double scale,
                     Value lse) {
  OpFoldResult N = terms.numTokens;
  if (terms.numSources == 1)
    return e.filled(
        {e.b.getIndexAttr(terms.numQueries), e.b.getIndexAttr(1), N}, 1.0);
  return e.generic({terms.ell, lse}, {e.map(3, {0, 1, 2}), e.map(3, {0, 2})},
                   e.empty({e.b.getIndexAttr(terms.numQueries),
                            e.b.getIndexAttr(terms.numSources), N}),
                   e.map(3, {0, 1, 2}), {kPar, kPar, kPar},
                   [&](FloatArithmetic &f, ValueRange x) {
                     return f.exp(f.sub(f.mul(f.constF32(scale), x[0]), x[1]));
                   });
}

/// o_pre[m, n, d] = sum_l p[m, l, n] * v[l, n, d]
Value mixSources(Emitter &e, const SourceTerms &terms, Value p) {
  OpBuilder &b = e.b;
  return e.generic({p, terms.sources},
                   {e.map(4, {0, 3, 1}), e.map(4, {3, 1, 2})},
                   e.filled({b.getIndexAttr(terms.numQueries), terms.numTokens,
                             b.getIndexAttr(terms.width)},
                            0.0),
                   e.map(4, {0, 1, 2}), {kPar, kPar, kPar, kRed},
                   [&](FloatArithmetic &f, ValueRange x) {
                     return f.add(x[2], f.mul(x[0], x[1]));
                   });
}

/// The output-norm weight as [Mh, D] in FP32 and the map that reads it from
/// an (m, n, d) iteration space.
std::pair<Value, AffineMap> outputNormWeight(Emitter &e, Value weight) {
  Value h = e.toF32(weight);
  if (cast<RankedTensorType>(h.getType()).getRank() == 1)
    return {h, e.map(3, {2})};
  return {h, e.map(3, {0, 2})};
}

/// rho_o[m, n] = 1 / sqrt(mean_d o_pre^2 + eps)
Value outputRho(Emitter &e, const SourceTerms &terms, Value oPre, double eps) {
  OpBuilder &b = e.b;
  OpFoldResult M = b.getIndexAttr(terms.numQueries), N = terms.numTokens;
  Value sumSquares = e.generic(
      {oPre}, {e.map(3, {0, 1, 2})}, e.filled({M, N}, 0.0), e.map(3, {0, 1}),
      {kPar, kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
        return f.add(x[1], f.mul(x[0], x[0]));
      });
  return e.generic(
      {sumSquares}, {e.map(2, {0, 1})}, e.empty({M, N}), e.map(2, {0, 1}),
      {kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
        Value mean = f.div(x[0], f.constF32(static_cast<double>(terms.width)));
        return f.rsqrt(f.add(mean, f.constF32(eps)));
      });
}

/// Restores a per-query result [M, N, ...] to the op's layout
/// [M?, T..., ...] and storage type `type`.
Value restorePerQuery(Emitter &e, const SourceTerms &terms, Value value,
                      bool multiQuery, RankedTensorType type) {
  OpBuilder &b = e.b;
  value = e.toElementType(value, type.getElementType());
  int64_t tokenDim = 1;
  if (!multiQuery) {
    auto valueType = cast<RankedTensorType>(value.getType());
    SmallVector<int64_t> shape(valueType.getShape().drop_front());
    auto dropped = RankedTensorType::get(shape, valueType.getElementType());
    value = tensor::createCanonicalRankReducingExtractSliceOp(b, e.loc, value,
                                                              dropped);
    tokenDim = 0;
  }
  return unflattenDims(b, e.loc, value, tokenDim, terms.tokenSizes, type);
}

/// The residual [..., D/2] (i8, two a byte) of `exact` ([..., D], FP32)
/// rounded to the 16-bit `element`, cast to `residualType`.
Value encodeResidual(Emitter &e, Value exact, Type element,
                     RankedTensorType residualType) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  auto type = cast<RankedTensorType>(exact.getType());
  int64_t rank = type.getRank();
  SmallVector<OpFoldResult> sizes = tensor::getMixedSizes(b, loc, exact);
  sizes.back() = b.getIndexAttr(type.getShape().back() / 2);
  SmallVector<OpFoldResult> strides(rank, b.getIndexAttr(1));
  strides.back() = b.getIndexAttr(2);
  auto elements = [&](int64_t first) -> Value {
    SmallVector<OpFoldResult> offsets(rank, b.getIndexAttr(0));
    offsets.back() = b.getIndexAttr(first);
    return tensor::ExtractSliceOp::create(b, loc, exact, offsets, sizes,
                                          strides);
  };
  Value init = tensor::EmptyOp::create(b, loc, sizes, b.getI8Type());
  AffineMap identity = AffineMap::getMultiDimIdentityMap(rank, b.getContext());
  int64_t bits = residual::fractionBits(element);
  auto generic = linalg::GenericOp::create(
      b, loc, TypeRange{init.getType()}, ValueRange{elements(0), elements(1)},
      ValueRange{init}, SmallVector<AffineMap>(3, identity),
      SmallVector<utils::IteratorType>(rank, kPar),
      [&](OpBuilder &n, Location nestedLoc, ValueRange args) {
        auto nibble = [&](Value value) {
          Value rounded = arith::ExtFOp::create(
              n, nestedLoc, e.f32,
              arith::TruncFOp::create(n, nestedLoc, element, value)
                  .getResult());
          return residual::encode(n, nestedLoc, value, rounded, bits);
        };
        linalg::YieldOp::create(
            n, nestedLoc,
            residual::pack(n, nestedLoc, nibble(args[0]), nibble(args[1])));
      });
  Value result = generic.getResult(0);
  if (result.getType() != residualType)
    result = tensor::CastOp::create(b, loc, residualType, result);
  return result;
}

/// o_pre [M, N, D] in FP32 from its 16-bit value `rounded` ([M, N, D], in
/// FP32) and its residual `packed` ([M, N, D/2], i8).
Value decodeResidual(Emitter &e, Value rounded, Value packed, Type element) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value init = tensor::EmptyOp::create(
      b, loc, tensor::getMixedSizes(b, loc, rounded), e.f32);
  AffineExpr d = b.getAffineDimExpr(2);
  AffineMap halfMap = AffineMap::get(
      3, 0, {b.getAffineDimExpr(0), b.getAffineDimExpr(1), d.floorDiv(2)},
      b.getContext());
  AffineMap identity = e.map(3, {0, 1, 2});
  int64_t bits = residual::fractionBits(element);
  auto generic = linalg::GenericOp::create(
      b, loc, TypeRange{init.getType()}, ValueRange{rounded, packed},
      ValueRange{init}, SmallVector<AffineMap>{identity, halfMap, identity},
      SmallVector<utils::IteratorType>(3, kPar),
      [&](OpBuilder &n, Location nestedLoc, ValueRange args) {
        auto [low, high] = residual::unpack(n, nestedLoc, args[1]);
        Value column = linalg::IndexOp::create(n, nestedLoc, 2);
        Value odd = arith::CmpIOp::create(
            n, nestedLoc, arith::CmpIPredicate::ne,
            arith::RemUIOp::create(
                n, nestedLoc, column,
                arith::ConstantIndexOp::create(n, nestedLoc, 2)),
            arith::ConstantIndexOp::create(n, nestedLoc, 0));
        Value nibble = arith::SelectOp::create(n, nestedLoc, odd, high, low);
        linalg::YieldOp::create(
            n, nestedLoc,
            residual::decode(n, nestedLoc, args[0], nibble, bits));
      });
  return generic.getResult(0);
}

struct ForwardLowering : OpRewritePattern<ForwardOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(ForwardOp op,
                                PatternRewriter &rewriter) const override {
    Emitter e(rewriter, op.getLoc());
    SourceTerms terms = computeSourceTerms(e, op);
    OpBuilder &b = e.b;
    double scale = op.getScale().convertToDouble();
    double eps = op.getEps().convertToDouble();
    OpFoldResult M = b.getIndexAttr(terms.numQueries), N = terms.numTokens;

    // lse[m, n] = max_l z + log(sum_l exp(z - max_l z)), z = scale * ell
    Value maxLogit =
        e.generic({terms.ell}, {e.map(3, {0, 2, 1})},
                  e.filled({M, N}, -Emitter::inf()), e.map(3, {0, 1}),
                  {kPar, kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
                    return f.maximum(x[1], f.mul(f.constF32(scale), x[0]));
                  });
    Value sumExp = e.generic(
        {terms.ell, maxLogit}, {e.map(3, {0, 2, 1}), e.map(3, {0, 1})},
        e.filled({M, N}, 0.0), e.map(3, {0, 1}), {kPar, kPar, kRed},
        [&](FloatArithmetic &f, ValueRange x) {
          Value z = f.mul(f.constF32(scale), x[0]);
          return f.add(x[2], f.exp(f.sub(z, x[1])));
        });
    Value lse =
        e.generic({maxLogit, sumExp}, {e.map(2, {0, 1}), e.map(2, {0, 1})},
                  e.empty({M, N}), e.map(2, {0, 1}), {kPar, kPar},
                  [&](FloatArithmetic &f, ValueRange x) {
                    return f.add(x[0], f.log(x[1]));
                  });

    Value p = softmaxWeights(e, terms, scale, lse);
    Value oPre = mixSources(e, terms, p);
    Value output = oPre;
    if (Value weight = op.getOutputNormWeight()) {
      auto [h, hMap] = outputNormWeight(e, weight);
      Value rho = outputRho(e, terms, oPre, eps);
      output = e.generic(
          {oPre, rho, h}, {e.map(3, {0, 1, 2}), e.map(3, {0, 1}), hMap},
          e.empty({M, N, b.getIndexAttr(terms.width)}), e.map(3, {0, 1, 2}),
          {kPar, kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
            return f.mul(f.mul(x[0], x[1]), x[2]);
          });
    }

    bool multi = op.isMultiQuery();
    SmallVector<Value> results{
        restorePerQuery(e, terms, output, multi, op.getOutput().getType()),
        restorePerQuery(e, terms, lse, multi, op.getLse().getType())};
    if (Value saved = op.getOPre())
      results.push_back(restorePerQuery(
          e, terms, oPre, multi, cast<RankedTensorType>(saved.getType())));
    if (Value residualResult = op.getOPreResidual()) {
      auto savedType = cast<RankedTensorType>(op.getOutput().getType());
      Value exact =
          restorePerQuery(e, terms, oPre, multi, savedType.clone(e.f32));
      results.push_back(
          encodeResidual(e, exact, savedType.getElementType(),
                         cast<RankedTensorType>(residualResult.getType())));
    }
    rewriter.replaceOp(op, results);
    return success();
  }
};

/// Brings a per-query operand [M?, T..., ...] of a backward to [M, N, ...]
/// in FP32.
Value normalizePerQuery(Emitter &e, Value value, bool multiQuery,
                        int64_t numTokenDims) {
  Value result = e.toF32(value);
  if (!multiQuery)
    result = flattenDims(e.b, e.loc, result, 0, 0);
  return flattenDims(e.b, e.loc, result, 1, numTokenDims);
}

struct BackwardLowering : OpRewritePattern<BackwardOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BackwardOp op,
                                PatternRewriter &rewriter) const override {
    Emitter e(rewriter, op.getLoc());
    SourceTerms terms = computeSourceTerms(e, op);
    OpBuilder &b = e.b;
    double scale = op.getScale().convertToDouble();
    double eps = op.getEps().convertToDouble();
    int64_t L = terms.numSources, D = terms.width, R = terms.rank;
    OpFoldResult M = b.getIndexAttr(terms.numQueries), N = terms.numTokens;
    auto idx = [&](int64_t v) -> OpFoldResult { return b.getIndexAttr(v); };
    bool multi = op.isMultiQuery();
    int64_t numTokenDims = op.getSourceType().getRank() - 1;

    Value lse = normalizePerQuery(e, op.getLse(), multi, numTokenDims);
    Value gradOutput =
        normalizePerQuery(e, op.getGradOutput(), multi, numTokenDims);
    Value p = softmaxWeights(e, terms, scale, lse);
    Value oPre = op.getSavedOutput() ? normalizePerQuery(e, op.getSavedOutput(),
                                                         multi, numTokenDims)
                                     : mixSources(e, terms, p);
    if (Value packed = op.getSavedResidual()) {
      // The residual is i8: reshaped like the saved o_pre, never widened.
      if (!multi)
        packed = flattenDims(b, e.loc, packed, 0, 0);
      packed = flattenDims(b, e.loc, packed, 1, numTokenDims);
      oPre = decodeResidual(
          e, oPre, packed, getElementTypeOrSelf(op.getSavedOutput().getType()));
    }

    // do_pre: the gradient of o_pre, through the output norm if there is one.
    Value gradOPre = gradOutput;
    Value gradOutputNorm;
    if (Value weight = op.getOutputNormWeight()) {
      auto [h, hMap] = outputNormWeight(e, weight);
      Value rho = outputRho(e, terms, oPre, eps);
      // mean_d(xhat * h * do), xhat = o_pre * rho_o
      Value meanTerm = e.generic(
          {oPre, rho, h, gradOutput},
          {e.map(3, {0, 1, 2}), e.map(3, {0, 1}), hMap, e.map(3, {0, 1, 2})},
          e.filled({M, N}, 0.0), e.map(3, {0, 1}), {kPar, kPar, kRed},
          [&](FloatArithmetic &f, ValueRange x) {
            Value xhat = f.mul(x[0], x[1]);
            return f.add(x[4], f.mul(f.mul(xhat, x[2]), x[3]));
          });
      gradOPre = e.generic(
          {oPre, rho, h, gradOutput, meanTerm},
          {e.map(3, {0, 1, 2}), e.map(3, {0, 1}), hMap, e.map(3, {0, 1, 2}),
           e.map(3, {0, 1})},
          e.empty({M, N, idx(D)}), e.map(3, {0, 1, 2}), {kPar, kPar, kPar},
          [&](FloatArithmetic &f, ValueRange x) {
            Value xhat = f.mul(x[0], x[1]);
            Value mean = f.div(x[4], f.constF32(static_cast<double>(D)));
            return f.mul(x[1], f.sub(f.mul(x[2], x[3]), f.mul(xhat, mean)));
          });
      // dh = sum over tokens (and queries, for a shared [D] weight) of
      // xhat * do.
      bool perQuery = cast<RankedTensorType>(h.getType()).getRank() == 2;
      if (perQuery) {
        gradOutputNorm = e.generic(
            {oPre, rho, gradOutput},
            {e.map(3, {0, 2, 1}), e.map(3, {0, 2}), e.map(3, {0, 2, 1})},
            e.filled({M, idx(D)}, 0.0), e.map(3, {0, 1}), {kPar, kPar, kRed},
            [&](FloatArithmetic &f, ValueRange x) {
              return f.add(x[3], f.mul(f.mul(x[0], x[1]), x[2]));
            });
      } else {
        gradOutputNorm = e.generic(
            {oPre, rho, gradOutput},
            {e.map(3, {1, 2, 0}), e.map(3, {1, 2}), e.map(3, {1, 2, 0})},
            e.filled({idx(D)}, 0.0), e.map(3, {0}), {kPar, kRed, kRed},
            [&](FloatArithmetic &f, ValueRange x) {
              return f.add(x[3], f.mul(f.mul(x[0], x[1]), x[2]));
            });
      }
    }

    // delta[m, n] = <do_pre, o_pre>
    Value delta =
        e.generic({gradOPre, oPre}, {e.map(3, {0, 1, 2}), e.map(3, {0, 1, 2})},
                  e.filled({M, N}, 0.0), e.map(3, {0, 1}), {kPar, kPar, kRed},
                  [&](FloatArithmetic &f, ValueRange x) {
                    return f.add(x[2], f.mul(x[0], x[1]));
                  });
    // An lse gradient adds scale * p * dlse to each logit's gradient, which
    // is delta - dlse in place of delta.
    if (Value gradLse = op.getGradLse()) {
      Value dlse = normalizePerQuery(e, gradLse, multi, numTokenDims);
      delta = e.generic(
          {delta, dlse}, {e.map(2, {0, 1}), e.map(2, {0, 1})}, e.empty({M, N}),
          e.map(2, {0, 1}), {kPar, kPar},
          [&](FloatArithmetic &f, ValueRange x) { return f.sub(x[0], x[1]); });
    }
    // ds[m, l, n] = scale * p * (<do_pre, v_l> - delta)
    Value gradDot = e.generic(
        {gradOPre, terms.sources}, {e.map(4, {0, 2, 3}), e.map(4, {1, 2, 3})},
        e.filled({M, idx(L), N}, 0.0), e.map(4, {0, 1, 2}),
        {kPar, kPar, kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
          return f.add(x[2], f.mul(x[0], x[1]));
        });
    Value ds =
        e.generic({p, gradDot, delta},
                  {e.map(3, {0, 1, 2}), e.map(3, {0, 1, 2}), e.map(3, {0, 2})},
                  e.empty({M, idx(L), N}), e.map(3, {0, 1, 2}),
                  {kPar, kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
                    Value diff = f.sub(x[1], x[2]);
                    return f.mul(f.constF32(scale), f.mul(x[0], diff));
                  });

    // dv[l, n, d] = sum_m p * do_pre, plus on the key coordinates
    // sum_m ds * rho * (a - khat * ell / R) with khat = rho * t.
    Value gradSources = e.generic(
        {p, gradOPre}, {e.map(4, {3, 0, 1}), e.map(4, {3, 1, 2})},
        e.filled({idx(L), N, idx(D)}, 0.0), e.map(4, {0, 1, 2}),
        {kPar, kPar, kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
          return f.add(x[2], f.mul(x[0], x[1]));
        });
    Value keyPart = tensor::ExtractSliceOp::create(
        b, e.loc, gradSources,
        ArrayRef<OpFoldResult>{idx(0), idx(0), idx(D - R)},
        ArrayRef<OpFoldResult>{idx(L), N, idx(R)},
        ArrayRef<OpFoldResult>{idx(1), idx(1), idx(1)});
    Value keyGrad = e.generic(
        {ds, terms.keyRho, terms.keyQuery, terms.key, terms.ell},
        {e.map(4, {3, 0, 1}), e.map(4, {0, 1}), e.map(4, {3, 2}),
         e.map(4, {0, 1, 2}), e.map(4, {3, 0, 1})},
        keyPart, e.map(4, {0, 1, 2}), {kPar, kPar, kPar, kRed},
        [&](FloatArithmetic &f, ValueRange x) {
          Value rho = x[1];
          Value khat = f.mul(rho, x[3]);
          Value correction =
              f.div(f.mul(khat, x[4]), f.constF32(static_cast<double>(R)));
          Value term = f.mul(f.mul(x[0], rho), f.sub(x[2], correction));
          return f.add(x[5], term);
        });
    gradSources = tensor::InsertSliceOp::create(
        b, e.loc, keyGrad, gradSources,
        ArrayRef<OpFoldResult>{idx(0), idx(0), idx(D - R)},
        ArrayRef<OpFoldResult>{idx(L), N, idx(R)},
        ArrayRef<OpFoldResult>{idx(1), idx(1), idx(1)});

    // da[m, r] = sum_l sum_n ds * rho * t, a reduction over every token in
    // a fixed order.
    Value gradKeyQuery = e.generic(
        {ds, terms.keyRho, terms.key},
        {e.map(4, {0, 2, 3}), e.map(4, {2, 3}), e.map(4, {2, 3, 1})},
        e.filled({M, idx(R)}, 0.0), e.map(4, {0, 1}), {kPar, kPar, kRed, kRed},
        [&](FloatArithmetic &f, ValueRange x) {
          return f.add(x[3], f.mul(x[0], f.mul(x[1], x[2])));
        });
    Value gradQuery = gradKeyQuery;
    Value gradKeyNorm;
    if (terms.keyNormWeight) {
      gradQuery = e.generic(
          {gradKeyQuery, terms.keyNormWeight},
          {e.map(2, {0, 1}), e.map(2, {1})}, e.empty({M, idx(R)}),
          e.map(2, {0, 1}), {kPar, kPar},
          [&](FloatArithmetic &f, ValueRange x) { return f.mul(x[0], x[1]); });
      gradKeyNorm = e.generic(
          {gradKeyQuery, terms.query}, {e.map(2, {1, 0}), e.map(2, {1, 0})},
          e.filled({idx(R)}, 0.0), e.map(2, {0}), {kPar, kRed},
          [&](FloatArithmetic &f, ValueRange x) {
            return f.add(x[2], f.mul(x[0], x[1]));
          });
    }

    // The gradients accumulated into, added in FP32 and rounded once with
    // the op's own.
    if (!op.getAccumulated().empty()) {
      Value accumulated = asLND(b, e.loc, op.getAccumulated(), op.getPacked(),
                                numTokenDims);
      gradSources = e.generic(
          {gradSources, accumulated},
          {e.map(3, {0, 1, 2}), e.map(3, {0, 1, 2})},
          e.empty({idx(L), N, idx(D)}), e.map(3, {0, 1, 2}),
          {kPar, kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
            return f.add(x[0], x[1]);
          });
    }

    // Results in the op's layout and types.
    SmallVector<Value> results;
    Type sourceElement = op.getSourceType().getElementType();
    gradSources = e.toElementType(gradSources, sourceElement);
    if (op.getPacked()) {
      results.push_back(unflattenDims(
          b, e.loc, gradSources, 1, terms.tokenSizes,
          cast<RankedTensorType>(op.getGradSources().front().getType())));
    } else {
      for (auto [index, grad] : llvm::enumerate(op.getGradSources())) {
        std::optional<int64_t> staticTokens = getConstantIntValue(N);
        auto sliceType = RankedTensorType::get(
            {staticTokens ? *staticTokens : ShapedType::kDynamic, D},
            sourceElement);
        Value slice = tensor::ExtractSliceOp::create(
            b, e.loc, sliceType, gradSources,
            ArrayRef<OpFoldResult>{idx(index), idx(0), idx(0)},
            ArrayRef<OpFoldResult>{idx(1), N, idx(D)},
            ArrayRef<OpFoldResult>{idx(1), idx(1), idx(1)});
        results.push_back(
            unflattenDims(b, e.loc, slice, 0, terms.tokenSizes,
                          cast<RankedTensorType>(grad.getType())));
      }
    }
    auto queryType = op.getGradQuery().getType();
    Value gradQueryResult =
        e.toElementType(gradQuery, queryType.getElementType());
    if (!multi)
      gradQueryResult = unflattenDims(b, e.loc, gradQueryResult, 0, {},
                                      cast<RankedTensorType>(queryType));
    results.push_back(gradQueryResult);
    if (Value grad = op.getGradKeyNormWeight())
      results.push_back(
          e.toElementType(gradKeyNorm, getElementTypeOrSelf(grad.getType())));
    if (Value grad = op.getGradOutputNormWeight())
      results.push_back(e.toElementType(gradOutputNorm,
                                        getElementTypeOrSelf(grad.getType())));
    rewriter.replaceOp(op, results);
    return success();
  }
};

struct PartitionReduceLowering : OpRewritePattern<PartitionReduceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(PartitionReduceOp op,
                                PatternRewriter &rewriter) const override {
    Emitter e(rewriter, op.getLoc());
    OpBuilder &b = e.b;
    Value partials = op.getPartials();
    auto partialsType = op.getPartials().getType();
    int64_t rank = partialsType.getRank();

    if (op.getKind() == ReduceKind::Sum) {
      // out[s...] = sum_p partials[p, s...], p innermost so the order is
      // p = 0, 1, ..., P-1.
      unsigned numDims = rank;
      SmallVector<unsigned> readDims{static_cast<unsigned>(rank - 1)};
      SmallVector<unsigned> outDims;
      for (unsigned dim = 0; dim + 1 < numDims; ++dim) {
        readDims.push_back(dim);
        outDims.push_back(dim);
      }
      SmallVector<utils::IteratorType> iterators(rank - 1, kPar);
      iterators.push_back(kRed);
      SmallVector<OpFoldResult> outShape =
          tensor::getMixedSizes(b, e.loc, partials);
      outShape.erase(outShape.begin());
      Value sum = e.generic(
          {partials}, {e.map(numDims, readDims)}, e.filled(outShape, 0.0),
          e.map(numDims, outDims), iterators,
          [&](FloatArithmetic &f, ValueRange x) { return f.add(x[1], x[0]); });
      Value result =
          e.toElementType(sum, getElementTypeOrSelf(op.getOutput().getType()));
      if (result.getType() != op.getOutput().getType())
        result =
            tensor::CastOp::create(b, e.loc, op.getOutput().getType(), result);
      rewriter.replaceOp(op, result);
      return success();
    }

    // Softmax merge over [P, N, D] partials with [P, N] lse and [N] sink.
    int64_t numTokenDims = rank - 2;
    SmallVector<OpFoldResult> sizes = tensor::getMixedSizes(b, e.loc, partials);
    SmallVector<OpFoldResult> tokenSizes(sizes.begin() + 1, sizes.end() - 1);
    Value flatPartials = flattenDims(b, e.loc, partials, 1, numTokenDims);
    Value partialLse =
        flattenDims(b, e.loc, op.getPartialLse(), 1, numTokenDims);
    OpFoldResult N = tensor::getMixedSize(b, e.loc, flatPartials, 1);
    OpFoldResult D = tensor::getMixedSize(b, e.loc, flatPartials, 2);
    double inf = Emitter::inf();

    // m = max(max_p lse_p, sink)
    Value sink;
    Value maxInit = e.filled({N}, -inf);
    if (op.getSink()) {
      sink = flattenDims(b, e.loc, op.getSink(), 0, numTokenDims);
      maxInit = sink;
    }
    Value maxLse =
        e.generic({partialLse}, {e.map(2, {1, 0})}, maxInit, e.map(2, {0}),
                  {kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
                    return f.maximum(x[1], x[0]);
                  });
    // w(x) = 0 for an empty partition (x = -inf), 1 for the maximum itself
    // (which keeps a +inf sink from producing inf - inf), exp(x - m) else.
    auto weight = [&](FloatArithmetic &f, Value x, Value m) {
      Value isEmpty = f.compare(arith::CmpFPredicate::OEQ, x, f.constF32(-inf));
      Value isMax = f.compare(arith::CmpFPredicate::OEQ, x, m);
      Value w = f.select(isMax, f.constF32(1.0), f.exp(f.sub(x, m)));
      return f.select(isEmpty, f.constF32(0.0), w);
    };
    // S = w(sink) + sum_p w(lse_p)
    Value sumInit = e.filled({N}, 0.0);
    if (sink)
      sumInit = e.generic({sink, maxLse}, {e.map(1, {0}), e.map(1, {0})},
                          e.empty({N}), e.map(1, {0}), {kPar},
                          [&](FloatArithmetic &f, ValueRange x) {
                            return weight(f, x[0], x[1]);
                          });
    Value total = e.generic(
        {partialLse, maxLse}, {e.map(2, {1, 0}), e.map(2, {0})}, sumInit,
        e.map(2, {0}), {kPar, kRed}, [&](FloatArithmetic &f, ValueRange x) {
          return f.add(x[2], weight(f, x[0], x[1]));
        });
    // o = sum_p w_p * o_p / S, skipping empty partitions so that their
    // garbage (NaN included) never reaches the sum.
    Value weighted = e.generic(
        {flatPartials, partialLse, maxLse},
        {e.map(3, {2, 0, 1}), e.map(3, {2, 0}), e.map(3, {0})},
        e.filled({N, D}, 0.0), e.map(3, {0, 1}), {kPar, kPar, kRed},
        [&](FloatArithmetic &f, ValueRange x) {
          Value w = weight(f, x[1], x[2]);
          Value contributes =
              f.compare(arith::CmpFPredicate::OGT, w, f.constF32(0.0));
          Value term = f.select(contributes, f.mul(w, x[0]), f.constF32(0.0));
          return f.add(x[3], term);
        });
    Value output = e.generic(
        {weighted, total}, {e.map(2, {0, 1}), e.map(2, {0})}, e.empty({N, D}),
        e.map(2, {0, 1}), {kPar, kPar}, [&](FloatArithmetic &f, ValueRange x) {
          Value any =
              f.compare(arith::CmpFPredicate::OGT, x[1], f.constF32(0.0));
          return f.select(any, f.div(x[0], x[1]), f.constF32(0.0));
        });
    Value lse = e.generic(
        {maxLse, total}, {e.map(1, {0}), e.map(1, {0})}, e.empty({N}),
        e.map(1, {0}), {kPar}, [&](FloatArithmetic &f, ValueRange x) {
          Value any =
              f.compare(arith::CmpFPredicate::OGT, x[1], f.constF32(0.0));
          return f.select(any, f.add(x[0], f.log(x[1])), f.constF32(-inf));
        });

    // Back to [T..., D]; the output norm, if any, works on whole rows there
    // (its weight may be per leading result dimension).
    auto outputType = cast<RankedTensorType>(op.getOutput().getType());
    Value merged =
        unflattenDims(b, e.loc, output, 0, tokenSizes, outputType.clone(e.f32));
    SmallVector<Value> results;
    Value normWeight = op.getOutputNormWeight();
    Value normalized = normWeight
                           ? normalizeRows(e, merged, e.toF32(normWeight),
                                           op.getEps().convertToDouble())
                           : merged;
    results.push_back(e.toElementType(normalized, outputType.getElementType()));
    results.push_back(
        unflattenDims(b, e.loc, lse, 0, tokenSizes,
                      cast<RankedTensorType>(op.getLse().getType())));
    if (op.getOPre())
      results.push_back(e.toElementType(merged, outputType.getElementType()));
    if (Value residualResult = op.getOPreResidual())
      results.push_back(
          encodeResidual(e, merged, outputType.getElementType(),
                         cast<RankedTensorType>(residualResult.getType())));
    rewriter.replaceOp(op, results);
    return success();
  }

  /// rows / sqrt(mean(rows^2) + eps) * weight over the last dimension of
  /// `rows`; `weight` is [D] or [K, D] with K the leading dimension.
  static Value normalizeRows(Emitter &e, Value rows, Value weight, double eps) {
    auto type = cast<RankedTensorType>(rows.getType());
    unsigned rank = type.getRank();
    SmallVector<unsigned> all = llvm::to_vector(llvm::seq<unsigned>(0, rank));
    SmallVector<unsigned> rowDims(all.begin(), all.end() - 1);
    SmallVector<utils::IteratorType> parallel(rank, kPar);
    SmallVector<utils::IteratorType> reduceLast(parallel);
    reduceLast.back() = kRed;
    SmallVector<OpFoldResult> sizes = tensor::getMixedSizes(e.b, e.loc, rows);
    SmallVector<OpFoldResult> rowSizes(sizes.begin(), sizes.end() - 1);
    Value sumSquares =
        e.generic({rows}, {e.map(rank, all)}, e.filled(rowSizes, 0.0),
                  e.map(rank, rowDims), reduceLast,
                  [&](FloatArithmetic &f, ValueRange x) {
                    return f.add(x[1], f.mul(x[0], x[0]));
                  });
    double width = static_cast<double>(type.getShape().back());
    AffineMap weightMap =
        cast<RankedTensorType>(weight.getType()).getRank() == 1
            ? e.map(rank, {rank - 1})
            : e.map(rank, {0, rank - 1});
    return e.generic({rows, sumSquares, weight},
                     {e.map(rank, all), e.map(rank, rowDims), weightMap},
                     e.empty(sizes), e.map(rank, all), parallel,
                     [&](FloatArithmetic &f, ValueRange x) {
                       Value mean = f.div(x[1], f.constF32(width));
                       Value rho = f.rsqrt(f.add(mean, f.constF32(eps)));
                       return f.mul(f.mul(x[0], rho), x[2]);
                     });
  }
};

struct ConvertAttnResToLinalgPass
    : attnres::impl::ConvertAttnResToLinalgBase<ConvertAttnResToLinalgPass> {
  void runOnOperation() override {
    if (failed(refuseOpsOnBuffers(getOperation(), getArgument())))
      return signalPassFailure();
    RewritePatternSet patterns(&getContext());
    populateAttnResToLinalgPatterns(patterns);
    ConversionTarget target(getContext());
    target.addIllegalDialect<AttnResDialect>();
    target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
    if (failed(applyPartialConversion(getOperation(), target,
                                      std::move(patterns))))
      signalPassFailure();
  }
};

} // namespace

void mlir::attnres::populateAttnResToLinalgPatterns(
    RewritePatternSet &patterns) {
  patterns.add<ForwardLowering, BackwardLowering, PartitionReduceLowering>(
      patterns.getContext());
}
