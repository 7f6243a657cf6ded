//===- AttnResTilingInterface.cpp - tiling the attnres ops over tokens ----===//
//
// The iteration domain of every attnres op is its token dimensions T...: a
// tile is a box of tokens, and the tiled op is the same op on the slices of
// its per-token operands (sources, grad, lse, saved, partials, sink); the
// per-op operands (query, weights) are shared by all tiles.
//
// * forward and partition_reduce: every token is independent, so the token
//   dimensions are parallel and any upstream SCF tiling applies.
// * backward: the source gradients are per token, but the query and weight
//   gradients are sums over every token, so the token dimensions are
//   reductions. A tile computes the source gradients of its tokens and FP32
//   partial sums of the weight gradients; combining the partials is
//   attnres-split-reduction's job (per-block partials and a `sum`
//   partition_reduce), and getResultTilePosition refuses those results so that
//   a generic tiling driver cannot overwrite one tile's partials with
//   another's.
//
//===----------------------------------------------------------------------===//

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/Dialect/Utils/StructuredOpsUtils.h"

using namespace mlir;
using namespace mlir::attnres;

namespace {

/// The position of the token dimensions in a per-token tensor.
struct TokenLayout {
  int64_t leading; // dimensions before the tokens (L when packed, M, P)
  int64_t count;   // number of token dimensions
};

SmallVector<int64_t> staticSizes(ArrayRef<OpFoldResult> sizes) {
  SmallVector<int64_t> shape;
  for (OpFoldResult size : sizes) {
    std::optional<int64_t> constant = getConstantIntValue(size);
    shape.push_back(constant ? *constant : ShapedType::kDynamic);
  }
  return shape;
}

/// The slice of `value` whose token dimensions are [offsets, offsets +
/// sizes); every other dimension is taken whole.
Value tokenSlice(OpBuilder &b, Location loc, Value value, TokenLayout layout,
                 ArrayRef<OpFoldResult> offsets, ArrayRef<OpFoldResult> sizes,
                 SmallVectorImpl<Operation *> &slices) {
  SmallVector<OpFoldResult> fullSizes = tensor::getMixedSizes(b, loc, value);
  SmallVector<OpFoldResult> sliceOffsets(fullSizes.size(), b.getIndexAttr(0));
  SmallVector<OpFoldResult> sliceSizes = fullSizes;
  for (int64_t i = 0; i < layout.count; ++i) {
    sliceOffsets[layout.leading + i] = offsets[i];
    sliceSizes[layout.leading + i] = sizes[i];
  }
  SmallVector<OpFoldResult> strides(fullSizes.size(), b.getIndexAttr(1));
  auto slice = tensor::ExtractSliceOp::create(b, loc, value, sliceOffsets,
                                              sliceSizes, strides);
  slices.push_back(slice);
  return slice;
}

/// The type of a per-token result after tiling.
RankedTensorType tileType(Type type, TokenLayout layout,
                          ArrayRef<OpFoldResult> sizes, Type elementType = {}) {
  auto tensor = cast<RankedTensorType>(type);
  SmallVector<int64_t> shape(tensor.getShape());
  SmallVector<int64_t> tokens = staticSizes(sizes);
  for (int64_t i = 0; i < layout.count; ++i)
    shape[layout.leading + i] = tokens[i];
  return RankedTensorType::get(shape, elementType ? elementType
                                                  : tensor.getElementType());
}

/// Offsets and sizes of a per-token result tile.
void tokenTilePosition(OpBuilder &b, Value result, TokenLayout layout,
                       ArrayRef<OpFoldResult> offsets,
                       ArrayRef<OpFoldResult> sizes,
                       SmallVector<OpFoldResult> &resultOffsets,
                       SmallVector<OpFoldResult> &resultSizes) {
  // Only token dimensions can be dynamic (L, M, D, R are static), and those
  // take the tile's sizes.
  auto type = cast<RankedTensorType>(result.getType());
  resultOffsets.assign(type.getRank(), b.getIndexAttr(0));
  resultSizes.clear();
  for (int64_t dim : type.getShape())
    resultSizes.push_back(b.getIndexAttr(dim));
  for (int64_t i = 0; i < layout.count; ++i) {
    resultOffsets[layout.leading + i] = offsets[i];
    resultSizes[layout.leading + i] = sizes[i];
  }
}

/// The token dimensions of `value` (a per-token tensor) as loop ranges.
SmallVector<Range> tokenDomain(OpBuilder &b, Value value, TokenLayout layout) {
  SmallVector<Range> domain;
  for (int64_t i = 0; i < layout.count; ++i)
    domain.push_back(Range{
        b.getIndexAttr(0),
        tensor::getMixedSize(b, value.getLoc(), value, layout.leading + i),
        b.getIndexAttr(1)});
  return domain;
}

/// Result shapes with the token dimensions read off `tokens`.
LogicalResult reifyShapes(OpBuilder &b, Operation *op, Value tokens,
                          TokenLayout tokenLayout,
                          function_ref<TokenLayout(unsigned)> resultLayout,
                          ReifiedRankedShapedTypeDims &shapes) {
  SmallVector<OpFoldResult> tokenSizes =
      tensor::getMixedSizes(b, op->getLoc(), tokens);
  for (OpResult result : op->getResults()) {
    auto type = cast<RankedTensorType>(result.getType());
    TokenLayout layout = resultLayout(result.getResultNumber());
    SmallVector<OpFoldResult> sizes;
    for (int64_t dim = 0; dim < type.getRank(); ++dim) {
      int64_t token = dim - layout.leading;
      if (token >= 0 && token < layout.count && type.isDynamicDim(dim))
        sizes.push_back(tokenSizes[tokenLayout.leading + token]);
      else
        sizes.push_back(b.getIndexAttr(type.getDimSize(dim)));
    }
    shapes.push_back(sizes);
  }
  return success();
}

template <typename OpT> int64_t numTokenDims(OpT op) {
  return op.getSourceType().getRank() - 1;
}

template <typename OpT> TokenLayout sourceLayout(OpT op) {
  return {op.getPacked() ? 1 : 0, numTokenDims(op)};
}

template <typename OpT> TokenLayout perQueryLayout(OpT op) {
  return {op.isMultiQuery() ? 1 : 0, numTokenDims(op)};
}

/// Slices of the sources for a token tile.
template <typename OpT>
SmallVector<Value> sourceTiles(OpBuilder &b, OpT op,
                               ArrayRef<OpFoldResult> offsets,
                               ArrayRef<OpFoldResult> sizes,
                               SmallVectorImpl<Operation *> &slices) {
  SmallVector<Value> tiles;
  for (Value source : op.getSources())
    tiles.push_back(tokenSlice(b, op.getLoc(), source, sourceLayout(op),
                               offsets, sizes, slices));
  return tiles;
}

} // namespace

//===----------------------------------------------------------------------===//
// ForwardOp
//===----------------------------------------------------------------------===//

SmallVector<utils::IteratorType> ForwardOp::getLoopIteratorTypes() {
  return SmallVector<utils::IteratorType>(numTokenDims(*this),
                                          utils::IteratorType::parallel);
}

SmallVector<Range> ForwardOp::getIterationDomain(OpBuilder &b) {
  return tokenDomain(b, getSources().front(), sourceLayout(*this));
}

FailureOr<TilingResult>
ForwardOp::getTiledImplementation(OpBuilder &b, ArrayRef<OpFoldResult> offsets,
                                  ArrayRef<OpFoldResult> sizes) {
  SmallVector<Operation *> slices;
  SmallVector<Value> operands = sourceTiles(b, *this, offsets, sizes, slices);
  llvm::append_range(operands, getOperands().drop_front(getSources().size()));
  SmallVector<Type> types;
  for (Value result : getResults())
    types.push_back(tileType(result.getType(), perQueryLayout(*this), sizes));
  Operation *tiled = mlir::clone(b, getOperation(), types, operands);
  return TilingResult{{tiled}, SmallVector<Value>(tiled->getResults()), slices};
}

LogicalResult ForwardOp::getResultTilePosition(
    OpBuilder &b, unsigned resultNumber, ArrayRef<OpFoldResult> offsets,
    ArrayRef<OpFoldResult> sizes, SmallVector<OpFoldResult> &resultOffsets,
    SmallVector<OpFoldResult> &resultSizes) {
  tokenTilePosition(b, getResult(resultNumber), perQueryLayout(*this), offsets,
                    sizes, resultOffsets, resultSizes);
  return success();
}

LogicalResult
ForwardOp::reifyResultShapes(OpBuilder &b,
                             ReifiedRankedShapedTypeDims &shapes) {
  return reifyShapes(
      b, *this, getSources().front(), sourceLayout(*this),
      [&](unsigned) { return perQueryLayout(*this); }, shapes);
}

//===----------------------------------------------------------------------===//
// BackwardOp
//===----------------------------------------------------------------------===//

SmallVector<utils::IteratorType> BackwardOp::getLoopIteratorTypes() {
  return SmallVector<utils::IteratorType>(numTokenDims(*this),
                                          utils::IteratorType::reduction);
}

SmallVector<Range> BackwardOp::getIterationDomain(OpBuilder &b) {
  return tokenDomain(b, getSources().front(), sourceLayout(*this));
}

FailureOr<TilingResult>
BackwardOp::getTiledImplementation(OpBuilder &b, ArrayRef<OpFoldResult> offsets,
                                   ArrayRef<OpFoldResult> sizes) {
  SmallVector<Operation *> slices;
  Location loc = getLoc();
  TokenLayout perQuery = perQueryLayout(*this);
  // Operands in their segment order: sources, query, weights, then the
  // per-token grad, lse, saved output, its residual and the lse gradient.
  SmallVector<Value> operands = sourceTiles(b, *this, offsets, sizes, slices);
  operands.push_back(getQuery());
  if (Value weight = getKeyNormWeight())
    operands.push_back(weight);
  if (Value weight = getOutputNormWeight())
    operands.push_back(weight);
  for (Value perToken : {getGradOutput(), getLse(), getSavedOutput(),
                         getSavedResidual(), getGradLse()})
    if (perToken)
      operands.push_back(
          tokenSlice(b, loc, perToken, perQuery, offsets, sizes, slices));
  // The gradients accumulated into, tiled as the sources.
  for (Value accumulated : getAccumulated())
    operands.push_back(tokenSlice(b, loc, accumulated, sourceLayout(*this),
                                  offsets, sizes, slices));
  // Source gradients are tiles of the sources; the parameter gradients of a
  // tile are FP32 partial sums over its tokens.
  SmallVector<Type> types;
  for (Value grad : getGradSources())
    types.push_back(tileType(grad.getType(), sourceLayout(*this), sizes));
  Type f32 = b.getF32Type();
  for (Value grad : getResults().drop_front(getGradSources().size()))
    types.push_back(cast<RankedTensorType>(grad.getType()).clone(f32));
  Operation *tiled = mlir::clone(b, getOperation(), types, operands);
  return TilingResult{{tiled}, SmallVector<Value>(tiled->getResults()), slices};
}

LogicalResult BackwardOp::getResultTilePosition(
    OpBuilder &b, unsigned resultNumber, ArrayRef<OpFoldResult> offsets,
    ArrayRef<OpFoldResult> sizes, SmallVector<OpFoldResult> &resultOffsets,
    SmallVector<OpFoldResult> &resultSizes) {
  // Query and weight gradients sum over every token: a tile holds a partial
  // sum, not a piece of the result (see attnres-split-reduction).
  if (resultNumber >= getGradSources().size())
    return failure();
  tokenTilePosition(b, getResult(resultNumber), sourceLayout(*this), offsets,
                    sizes, resultOffsets, resultSizes);
  return success();
}

LogicalResult
BackwardOp::reifyResultShapes(OpBuilder &b,
                              ReifiedRankedShapedTypeDims &shapes) {
  unsigned numSourceGrads = getGradSources().size();
  return reifyShapes(
      b, *this, getSources().front(), sourceLayout(*this),
      [&](unsigned result) {
        return result < numSourceGrads ? sourceLayout(*this)
                                       : TokenLayout{0, 0};
      },
      shapes);
}

//===----------------------------------------------------------------------===//
// PartitionReduceOp
//===----------------------------------------------------------------------===//

namespace {
/// The token dimensions of the partials: everything after P, except the
/// width D of a softmax merge (which needs whole rows).
TokenLayout partialsLayout(PartitionReduceOp op) {
  int64_t rank = op.getPartials().getType().getRank();
  return {1, op.getKind() == ReduceKind::Softmax ? rank - 2 : rank - 1};
}
} // namespace

SmallVector<utils::IteratorType> PartitionReduceOp::getLoopIteratorTypes() {
  return SmallVector<utils::IteratorType>(partialsLayout(*this).count,
                                          utils::IteratorType::parallel);
}

SmallVector<Range> PartitionReduceOp::getIterationDomain(OpBuilder &b) {
  return tokenDomain(b, getPartials(), partialsLayout(*this));
}

FailureOr<TilingResult>
PartitionReduceOp::getTiledImplementation(OpBuilder &b,
                                          ArrayRef<OpFoldResult> offsets,
                                          ArrayRef<OpFoldResult> sizes) {
  SmallVector<Operation *> slices;
  Location loc = getLoc();
  TokenLayout layout = partialsLayout(*this);
  SmallVector<Value> operands{
      tokenSlice(b, loc, getPartials(), layout, offsets, sizes, slices)};
  if (Value lse = getPartialLse())
    operands.push_back(tokenSlice(b, loc, lse, layout, offsets, sizes, slices));
  if (Value sink = getSink())
    operands.push_back(
        tokenSlice(b, loc, sink, {0, layout.count}, offsets, sizes, slices));
  if (Value weight = getOutputNormWeight()) {
    // A [K, D] weight follows the leading result dimension, which is the
    // first token dimension of the tile.
    if (cast<RankedTensorType>(weight.getType()).getRank() == 2)
      weight = tokenSlice(b, loc, weight, {0, 1}, offsets.take_front(),
                          sizes.take_front(), slices);
    operands.push_back(weight);
  }
  SmallVector<Type> types;
  for (Value result : getResults())
    types.push_back(tileType(result.getType(), {0, layout.count}, sizes));
  Operation *tiled = mlir::clone(b, getOperation(), types, operands);
  return TilingResult{{tiled}, SmallVector<Value>(tiled->getResults()), slices};
}

LogicalResult PartitionReduceOp::getResultTilePosition(
    OpBuilder &b, unsigned resultNumber, ArrayRef<OpFoldResult> offsets,
    ArrayRef<OpFoldResult> sizes, SmallVector<OpFoldResult> &resultOffsets,
    SmallVector<OpFoldResult> &resultSizes) {
  tokenTilePosition(b, getResult(resultNumber),
                    {0, partialsLayout(*this).count}, offsets, sizes,
                    resultOffsets, resultSizes);
  return success();
}

LogicalResult
PartitionReduceOp::reifyResultShapes(OpBuilder &b,
                                     ReifiedRankedShapedTypeDims &shapes) {
  TokenLayout layout = partialsLayout(*this);
  return reifyShapes(
      b, *this, getPartials(), layout,
      [&](unsigned) {
        return TokenLayout{0, layout.count};
      },
      shapes);
}
