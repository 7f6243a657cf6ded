//===- SplitBackward.cpp - attnres-split-reduction's loop on the grid -----===//
//
// attnres-split-reduction rewrites a backward over N tokens into
//
//   scf.forall (%b) in (B) {
//     the backward over tokens [min(b * ceil(N / B), N),
//                               min(b * ceil(N / B) + ceil(N / B), N)),
//     its source gradients inserted at those tokens,
//     its query / weight gradients as row b of FP32 [B, ...] partials
//   }
//   a partition_reduce sum of each partial gradient's B rows.
//
// The backward kernel is that decomposition: block blockIdx.x = b covers
// exactly those tokens, writes its partial rows, and the finalize kernel
// sums them. So under keep-host the loop with its sums becomes one launch
// of the kernel on the loop's B blocks and its finalize: the loop's count
// is the grid. (B is a constant: partition_reduce sums a static count.)
//
// Nothing is taken on trust: the slices, the insertions and the two
// affine.min ops that bound a block are checked against the rule above
// (after composing them), and a loop around a backward that is not of this
// form is refused with the reason.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/AffineExprVisitor.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::attnres::gpu_kernels;

namespace {

class SplitBackwardMatcher {
public:
  SplitBackwardMatcher(scf::ForallOp loop, BackwardOp tile)
      : loop(loop), tile(tile) {}

  /// Checks the loop; on success `outer*` hold the backward's operands
  /// outside it and `sums` the partition_reduce of each partial gradient,
  /// else `reason` says what differs.
  LogicalResult check();

  SmallVector<Value> outerSources;
  Value outerGrad, outerLse, outerSaved, outerSavedResidual;
  SmallVector<PartitionReduceOp> sums;
  std::string reason;

private:
  LogicalResult fail(const Twine &why) {
    reason = why.str();
    return failure();
  }
  LogicalResult checkBounds();
  LogicalResult sliceOf(Value operand, int64_t tokenDim, StringRef what,
                        Value &outer);
  LogicalResult checkMin(Value value, ArrayRef<AffineExpr> expected,
                         StringRef what);
  AffineExpr tokenCountExpr();

  scf::ForallOp loop;
  BackwardOp tile;
  /// The block's first token and token count (the slices' offset and
  /// size on the token dimension).
  Value offset, size;
  /// The outer operands whose token dimension is N (for tensor.dim).
  SmallVector<std::pair<Value, int64_t>> tokenTensors;
  int64_t staticTokens = ShapedType::kDynamic;
};

bool isIndex(OpFoldResult value, int64_t expected) {
  std::optional<int64_t> constant = getConstantIntValue(value);
  return constant && *constant == expected;
}

/// `operand`, a slice of a tensor defined outside the loop that keeps every
/// dimension whole except `tokenDim`, which it takes at [offset, offset +
/// size): the first such slice fixes offset and size for all others.
LogicalResult SplitBackwardMatcher::sliceOf(Value operand, int64_t tokenDim,
                                            StringRef what, Value &outer) {
  if (!operand)
    return success();
  auto slice = operand.getDefiningOp<tensor::ExtractSliceOp>();
  if (!slice || !loop.isDefinedOutsideOfLoop(slice.getSource()))
    return fail("the backward's " + what +
                " is not a slice of a tensor defined outside the loop");
  RankedTensorType whole = slice.getSourceType();
  if (slice.getResultType().getRank() != whole.getRank() ||
      tokenDim >= whole.getRank())
    return fail("the slice of the backward's " + what + " drops dimensions");
  for (int64_t dim = 0; dim < whole.getRank(); ++dim) {
    OpFoldResult at = slice.getMixedOffsets()[dim];
    OpFoldResult length = slice.getMixedSizes()[dim];
    if (!isIndex(slice.getMixedStrides()[dim], 1))
      return fail("the slice of the backward's " + what + " is strided");
    if (dim != tokenDim) {
      if (!isIndex(at, 0) || whole.isDynamicDim(dim) ||
          !isIndex(length, whole.getDimSize(dim)))
        return fail("the slice of the backward's " + what +
                    " does not keep dimension " + Twine(dim) + " whole");
      continue;
    }
    auto atValue = dyn_cast<Value>(at);
    auto lengthValue = dyn_cast<Value>(length);
    if (!atValue || !lengthValue)
      return fail("the backward's " + what +
                  " is not sliced by the block's token bounds");
    if (!offset) {
      offset = atValue;
      size = lengthValue;
    } else if (atValue != offset || lengthValue != size) {
      return fail("the backward's operands are sliced at different tokens");
    }
  }
  outer = slice.getSource();
  tokenTensors.emplace_back(outer, tokenDim);
  int64_t tokens = whole.getDimSize(tokenDim);
  if (staticTokens == ShapedType::kDynamic)
    staticTokens = tokens;
  else if (staticTokens != tokens)
    return fail("the backward's operands have different token counts");
  return success();
}

/// N in the affine expressions: the static token count, else symbol 0.
AffineExpr SplitBackwardMatcher::tokenCountExpr() {
  MLIRContext *context = loop.getContext();
  if (ShapedType::isStatic(staticTokens))
    return getAffineConstantExpr(staticTokens, context);
  return getAffineSymbolExpr(0, context);
}

/// Whether `value` is an affine.min whose results are `expected` (in any
/// order), over d0 = the loop's index, s0 = N and s1 = the block's first
/// token.
LogicalResult SplitBackwardMatcher::checkMin(Value value,
                                             ArrayRef<AffineExpr> expected,
                                             StringRef what) {
  auto min = value.getDefiningOp<affine::AffineMinOp>();
  if (!min)
    return fail("the block's " + what + " is not an affine.min");
  AffineMap map = min.getAffineMap();
  SmallVector<Value> operands(min.getOperands());
  affine::fullyComposeAffineMapAndOperands(&map, &operands);
  affine::canonicalizeMapAndOperands(&map, &operands);
  MLIRContext *context = loop.getContext();
  auto isTokenCount = [&](Value candidate) {
    auto dim = candidate.getDefiningOp<tensor::DimOp>();
    std::optional<int64_t> index =
        dim ? getConstantIntValue(dim.getDimension()) : std::nullopt;
    return index &&
           llvm::is_contained(tokenTensors,
                              std::make_pair(Value(dim.getSource()), *index));
  };
  SmallVector<AffineExpr> replacements;
  for (Value operand : operands) {
    if (std::optional<int64_t> constant = getConstantIntValue(operand))
      replacements.push_back(getAffineConstantExpr(*constant, context));
    else if (operand == loop.getInductionVar(0))
      replacements.push_back(getAffineDimExpr(0, context));
    else if (isTokenCount(operand))
      replacements.push_back(getAffineSymbolExpr(0, context));
    else if (offset && operand == offset && value != offset)
      replacements.push_back(getAffineSymbolExpr(1, context));
    else
      return fail("the block's " + what +
                  " depends on values other than the loop index and N");
  }
  unsigned numDims = map.getNumDims();
  ArrayRef<AffineExpr> all(replacements);
  AffineMap renamed = map.replaceDimsAndSymbols(all.take_front(numDims),
                                                all.drop_front(numDims), 1, 2);
  SmallVector<AffineExpr> found;
  for (AffineExpr result : renamed.getResults())
    found.push_back(simplifyAffineExpr(result, 1, 2));
  SmallVector<AffineExpr> wanted;
  for (AffineExpr result : expected)
    wanted.push_back(simplifyAffineExpr(result, 1, 2));
  if (found.size() != wanted.size() ||
      !llvm::all_of(wanted, [&](AffineExpr expr) {
        return llvm::is_contained(found, expr);
      }))
    return fail("the block's " + what + " is not the rule's " +
                "(min(b * ceil(N / B), N) and min(ceil(N / B), N - first))");
  return success();
}

LogicalResult SplitBackwardMatcher::checkBounds() {
  MLIRContext *context = loop.getContext();
  AffineExpr b = getAffineDimExpr(0, context);
  AffineExpr N = tokenCountExpr();
  AffineExpr chunk =
      N.ceilDiv(*getConstantIntValue(loop.getMixedUpperBound().front()));
  if (failed(checkMin(offset, {b * chunk, N}, "first token")))
    return failure();
  return checkMin(size, {chunk, N - getAffineSymbolExpr(1, context)},
                  "token count");
}

LogicalResult SplitBackwardMatcher::check() {
  if (loop.getRank() != 1 || !isIndex(loop.getMixedLowerBound()[0], 0) ||
      !isIndex(loop.getMixedStep()[0], 1) || loop.getMapping())
    return fail("the loop is not one unmapped dimension from 0 by 1");
  if (tile->getParentOp() != loop)
    return fail("the backward is nested deeper than the loop's body");
  RankedTensorType sourceType = tile.getSourceType();
  std::optional<int64_t> count =
      getConstantIntValue(loop.getMixedUpperBound()[0]);
  if (!count || *count < 1)
    return fail("the loop's count is not a positive constant");
  int64_t sourceLead = tile.getPacked() ? 1 : 0;
  int64_t perQueryLead = tile.isMultiQuery() ? 1 : 0;
  if (sourceType.getRank() != 2)
    return fail("the backward has more than one token dimension");

  for (auto [l, source] : llvm::enumerate(tile.getSources())) {
    Value outer;
    if (failed(
            sliceOf(source, sourceLead, "source " + std::to_string(l), outer)))
      return failure();
    outerSources.push_back(outer);
  }
  if (failed(sliceOf(tile.getGradOutput(), perQueryLead, "output gradient",
                     outerGrad)) ||
      failed(sliceOf(tile.getLse(), perQueryLead, "lse", outerLse)) ||
      failed(sliceOf(tile.getSavedOutput(), perQueryLead, "saved output",
                     outerSaved)) ||
      failed(sliceOf(tile.getSavedResidual(), perQueryLead, "saved residual",
                     outerSavedResidual)))
    return failure();
  for (Value weight :
       {tile.getQuery(), tile.getKeyNormWeight(), tile.getOutputNormWeight()})
    if (weight && !loop.isDefinedOutsideOfLoop(weight))
      return fail("the backward's weights are computed in the loop");
  if (failed(checkBounds()))
    return failure();

  // Besides the backward, the body holds only what has no effect but its
  // results (the slices and bounds checked above, sizes the tiling left
  // unused): nothing else the kernel would have to do.
  for (Operation &op : loop.getBody()->without_terminator())
    if (&op != tile.getOperation() &&
        (isa<ForwardOp, BackwardOp, PartitionReduceOp>(op) ||
         !isMemoryEffectFree(&op)))
      return fail("the loop's body does more than one backward ('" +
                  op.getName().getStringRef() + "')");

  // Each result of the backward goes to its own shared output: a source
  // gradient at the block's tokens, a partial gradient as row b.
  unsigned numSourceGrads = tile.getGradSources().size();
  scf::InParallelOp terminator = loop.getTerminator();
  SmallVector<Operation *> yields;
  for (Operation &op : terminator.getYieldingOps())
    yields.push_back(&op);
  if (yields.size() != tile->getNumResults() ||
      loop.getNumResults() != tile->getNumResults())
    return fail("the loop's results are not the backward's");
  Value block = loop.getInductionVar(0);
  for (auto [index, op] : llvm::enumerate(yields)) {
    auto insert = dyn_cast<tensor::ParallelInsertSliceOp>(op);
    if (!insert || insert.getSource() != tile->getResult(index) ||
        insert.getDest() != loop.getRegionIterArgs()[index])
      return fail("result " + Twine(index) +
                  " of the backward is not inserted into shared "
                  "output " +
                  Twine(index));
    RankedTensorType destType = insert.getDestType();
    for (int64_t dim = 0; dim < destType.getRank(); ++dim) {
      if (!isIndex(insert.getMixedStrides()[dim], 1))
        return fail("a result is inserted with strides");
      OpFoldResult at = insert.getMixedOffsets()[dim];
      OpFoldResult length = insert.getMixedSizes()[dim];
      bool ok;
      if (index < numSourceGrads && dim == sourceLead)
        ok = dyn_cast<Value>(at) == offset && dyn_cast<Value>(length) == size;
      else if (index >= numSourceGrads && dim == 0)
        ok = dyn_cast<Value>(at) == block && isIndex(length, 1);
      else
        ok = isIndex(at, 0) && !destType.isDynamicDim(dim) &&
             isIndex(length, destType.getDimSize(dim));
      if (!ok)
        return fail("result " + Twine(index) +
                    " of the backward is not inserted at its block's "
                    "place");
    }
    if (index < numSourceGrads && destType != outerSources[index].getType())
      return fail("a source gradient is not shaped like its source");
    if (index >= numSourceGrads) {
      Value partials = loop.getResult(index);
      auto sum = partials.hasOneUse()
                     ? dyn_cast<PartitionReduceOp>(*partials.user_begin())
                     : PartitionReduceOp();
      if (!sum || sum.getKind() != ReduceKind::Sum || sum.getOutputNormWeight())
        return fail("the partial gradients of result " + Twine(index) +
                    " are not summed by one partition_reduce sum");
      sums.push_back(sum);
    }
  }
  return success();
}

} // namespace

LogicalResult gpu_kernels::absorbSplitBackwards(
    ModuleOp module, llvm::DenseMap<Operation *, int64_t> &blocks) {
  SmallVector<std::pair<scf::ForallOp, BackwardOp>> loops;
  module.walk([&](BackwardOp op) {
    if (auto loop = dyn_cast<scf::ForallOp>(op->getParentOp()))
      loops.emplace_back(loop, op);
  });
  for (auto [loop, tile] : loops) {
    SplitBackwardMatcher matcher(loop, tile);
    if (failed(matcher.check()))
      return loop.emitError("convert-attnres-to-gpu: keep-host=1 launches an "
                            "scf.forall around a backward as the backward "
                            "kernel's blocks, which needs the form of "
                            "attnres-split-reduction; here ")
             << matcher.reason;

    // The backward over all tokens, whose launch takes the loop's count.
    OpBuilder b(loop);
    SmallVector<Type> sourceGradTypes;
    unsigned numSourceGrads = tile.getGradSources().size();
    for (Value result : loop.getResults().take_front(numSourceGrads))
      sourceGradTypes.push_back(result.getType());
    SmallVector<Type> summed;
    for (PartitionReduceOp sum : matcher.sums)
      summed.push_back(sum.getOutput().getType());
    auto typeAt = [&](size_t index) {
      return index < summed.size() ? summed[index] : Type();
    };
    // The partial gradients are dq, then dg and dh where present.
    size_t next = 1;
    Type dgType = tile.getGradKeyNormWeight() ? typeAt(next++) : Type();
    Type dhType = tile.getGradOutputNormWeight() ? typeAt(next++) : Type();
    auto whole = BackwardOp::create(
        b, tile.getLoc(), sourceGradTypes, typeAt(0), dgType, dhType,
        matcher.outerSources, tile.getPackedAttr(), tile.getQuery(),
        tile.getKeyNormWeight(), tile.getOutputNormWeight(), matcher.outerGrad,
        matcher.outerLse, matcher.outerSaved, matcher.outerSavedResidual,
        tile.getEpsAttr(), tile.getScaleAttr());
    if (failed(whole.verify())) {
      whole.erase();
      return loop.emitError("convert-attnres-to-gpu: the backward of "
                            "attnres-split-reduction's loop over all tokens "
                            "does not verify");
    }
    blocks[whole] = *getConstantIntValue(loop.getMixedUpperBound().front());
    for (auto [index, sum] : llvm::enumerate(matcher.sums)) {
      sum.getOutput().replaceAllUsesWith(
          whole->getResult(numSourceGrads + index));
      sum.erase();
    }
    llvm::SetVector<Operation *> inits;
    for (Value init : loop.getOutputs())
      if (Operation *producer = init.getDefiningOp())
        inits.insert(producer);
    for (auto [index, result] :
         llvm::enumerate(loop.getResults().take_front(numSourceGrads)))
      result.replaceAllUsesWith(whole->getResult(index));
    loop.erase();
    for (Operation *init : inits)
      if (isa<tensor::EmptyOp>(init) && init->use_empty())
        init->erase();
  }
  return success();
}
