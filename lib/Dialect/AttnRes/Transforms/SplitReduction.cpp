//===- SplitReduction.cpp - backward token reductions -> block partials ---===//

#include "PassOptions.h"
#include "attnres/Bundle/LaunchRules.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"
#include "attnres/Dialect/AttnRes/Transforms/Passes.h"
#include "attnres/Dialect/AttnRes/Utils/Reshape.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESSPLITREDUCTION
#include "attnres/Dialect/AttnRes/Transforms/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;

namespace {

/// Rewrites `op` to have exactly one token dimension (the product of its
/// token dimensions) and returns the new op; the results of `op` are
/// replaced by the new results, reshaped back.
BackwardOp withOneTokenDim(IRRewriter &rewriter, BackwardOp op) {
  int64_t numTokenDims = op.getSourceType().getRank() - 1;
  if (numTokenDims == 1)
    return op;
  Location loc = op.getLoc();
  rewriter.setInsertionPoint(op);
  int64_t sourceLead = op.getPacked() ? 1 : 0;
  int64_t perQueryLead = op.isMultiQuery() ? 1 : 0;
  SmallVector<OpFoldResult> tokenSizes =
      tensor::getMixedSizes(rewriter, loc, op.getSources().front());
  tokenSizes.erase(tokenSizes.begin(), tokenSizes.begin() + sourceLead);
  tokenSizes.pop_back();

  SmallVector<Value> sources;
  for (Value source : op.getSources())
    sources.push_back(
        flattenDims(rewriter, loc, source, sourceLead, numTokenDims));
  auto flat = [&](Value perToken) -> Value {
    return perToken ? flattenDims(rewriter, loc, perToken, perQueryLead,
                                  numTokenDims)
                    : Value();
  };
  SmallVector<Type> gradSourceTypes;
  for (Value source : sources)
    gradSourceTypes.push_back(source.getType());
  SmallVector<Value> accumulated;
  for (Value gradient : op.getAccumulated())
    accumulated.push_back(
        flattenDims(rewriter, loc, gradient, sourceLead, numTokenDims));
  auto typeOf = [](Value value) { return value ? value.getType() : Type(); };
  auto flatOp = BackwardOp::create(
      rewriter, loc, gradSourceTypes, op.getGradQuery().getType(),
      typeOf(op.getGradKeyNormWeight()), typeOf(op.getGradOutputNormWeight()),
      sources, op.getPackedAttr(), op.getQuery(), op.getKeyNormWeight(),
      op.getOutputNormWeight(), flat(op.getGradOutput()), flat(op.getLse()),
      flat(op.getSavedOutput()), flat(op.getSavedResidual()),
      flat(op.getGradLse()), accumulated, op.getEpsAttr(), op.getScaleAttr());

  SmallVector<Value> replacements;
  for (auto [grad, original] :
       llvm::zip(flatOp.getGradSources(), op.getGradSources()))
    replacements.push_back(
        unflattenDims(rewriter, loc, grad, sourceLead, tokenSizes,
                      cast<RankedTensorType>(original.getType())));
  llvm::append_range(replacements,
                     flatOp.getResults().drop_front(sources.size()));
  rewriter.replaceOp(op, replacements);
  return flatOp;
}

LogicalResult splitBackward(IRRewriter &rewriter, BackwardOp op,
                            int64_t blocks) {
  op = withOneTokenDim(rewriter, op);
  Location loc = op.getLoc();
  rewriter.setInsertionPoint(op);
  MLIRContext *context = rewriter.getContext();
  auto tiling = cast<TilingInterface>(op.getOperation());
  OpFoldResult tokens = tiling.getIterationDomain(rewriter).front().size;

  // Block b covers [min(b * chunk, N), min(b * chunk + chunk, N)).
  AffineExpr d0, s0, s1;
  bindDims(context, d0);
  bindSymbols(context, s0, s1);
  OpFoldResult chunk = affine::makeComposedFoldedAffineApply(
      rewriter, loc, s0.ceilDiv(s1), {tokens, rewriter.getIndexAttr(blocks)});

  unsigned numSourceGrads = op.getGradSources().size();
  // The source gradients are written tile by tile into the gradients they
  // accumulate into, where the op accumulates, else into new tensors.
  SmallVector<Value> inits(op.getAccumulated());
  if (inits.empty())
    for (Value grad : op.getGradSources()) {
      auto type = cast<RankedTensorType>(grad.getType());
      SmallVector<OpFoldResult> sizes =
          tensor::getMixedSizes(rewriter, loc, op.getSources().front());
      inits.push_back(
          tensor::EmptyOp::create(rewriter, loc, sizes, type.getElementType()));
    }
  Type f32 = rewriter.getF32Type();
  for (Value grad : op.getResults().drop_front(numSourceGrads)) {
    SmallVector<int64_t> shape{blocks};
    llvm::append_range(shape,
                       cast<RankedTensorType>(grad.getType()).getShape());
    inits.push_back(tensor::EmptyOp::create(rewriter, loc, shape, f32));
  }

  LogicalResult status = success();
  auto forall = scf::ForallOp::create(
      rewriter, loc, ArrayRef<OpFoldResult>{rewriter.getIndexAttr(blocks)},
      inits, /*mapping=*/std::nullopt,
      [&](OpBuilder &b, Location nestedLoc, ValueRange args) {
        Value block = args[0];
        ValueRange outs = args.drop_front();
        OpFoldResult offset = affine::makeComposedFoldedAffineMin(
            b, nestedLoc, AffineMap::get(1, 2, {d0 * s0, s1}, context),
            {block, chunk, tokens});
        OpFoldResult size = affine::makeComposedFoldedAffineMin(
            b, nestedLoc,
            AffineMap::get(0, 3, {s0, s1 - getAffineSymbolExpr(2, context)},
                           context),
            {chunk, tokens, offset});
        FailureOr<TilingResult> tile =
            tiling.getTiledImplementation(b, {offset}, {size});
        if (failed(tile)) {
          status = failure();
          return;
        }
        // A tile accumulates into its slice of the block's gradients (the
        // forall's outputs), so that bufferization keeps them in place.
        auto tiled = cast<BackwardOp>(tile->tiledOps.front());
        OpBuilder::InsertionGuard beforeTile(b);
        b.setInsertionPoint(tiled);
        for (OpOperand &accumulated : tiled.getAccumulatedMutable()) {
          unsigned index = accumulated.getOperandNumber() -
                           tiled.getAccumulated().getBeginOperandIndex();
          SmallVector<OpFoldResult> offsets, sizes;
          if (failed(tiling.getResultTilePosition(b, index, {offset}, {size},
                                                  offsets, sizes))) {
            status = failure();
            return;
          }
          Operation *original = accumulated.get().getDefiningOp();
          accumulated.set(tensor::ExtractSliceOp::create(
              b, nestedLoc, outs[index], offsets, sizes,
              SmallVector<OpFoldResult>(offsets.size(), b.getIndexAttr(1))));
          if (original && original->use_empty())
            original->erase();
        }
        b.setInsertionPointAfter(tiled);
        auto terminator = scf::InParallelOp::create(b, nestedLoc);
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPointToStart(terminator.getBody());
        for (auto [index, value] : llvm::enumerate(tile->tiledValues)) {
          auto outType = cast<RankedTensorType>(outs[index].getType());
          SmallVector<OpFoldResult> offsets, sizes;
          if (index < numSourceGrads) {
            if (failed(tiling.getResultTilePosition(b, index, {offset}, {size},
                                                    offsets, sizes))) {
              status = failure();
              return;
            }
          } else {
            // Row `block` of the [B, ...] partials.
            offsets.assign(outType.getRank(), b.getIndexAttr(0));
            offsets[0] = block;
            sizes.push_back(b.getIndexAttr(1));
            for (int64_t dim : outType.getShape().drop_front())
              sizes.push_back(b.getIndexAttr(dim));
          }
          SmallVector<OpFoldResult> strides(outType.getRank(),
                                            b.getIndexAttr(1));
          tensor::ParallelInsertSliceOp::create(
              b, nestedLoc, value, outs[index], offsets, sizes, strides);
        }
      });
  if (failed(status))
    return op.emitError("attnres-split-reduction: could not tile the backward");

  SmallVector<Value> replacements(
      forall.getResults().take_front(numSourceGrads));
  for (auto [partials, grad] :
       llvm::zip(forall.getResults().drop_front(numSourceGrads),
                 op.getResults().drop_front(numSourceGrads))) {
    auto sum = PartitionReduceOp::create(
        rewriter, loc, grad.getType(), /*lse=*/Type(), /*o_pre=*/Type(),
        /*o_pre_residual=*/Type(),
        ReduceKindAttr::get(rewriter.getContext(), ReduceKind::Sum), partials,
        /*partial_lse=*/Value(), /*sink=*/Value(),
        /*output_norm_weight=*/Value(), rewriter.getF64FloatAttr(1e-6));
    replacements.push_back(sum.getOutput());
  }
  rewriter.replaceOp(op, replacements);
  return success();
}

struct SplitReductionPass
    : mlir::attnres::impl::AttnResSplitReductionBase<SplitReductionPass> {
  using Base::Base;

  /// The rule documented in Passes.td for blocks=auto; none where the
  /// token count is dynamic or the target's size is left to run time (the
  /// op stays whole: the GPU kernels then size their blocks at run time).
  std::optional<int64_t> automaticBlocks(BackwardOp op) {
    RankedTensorType sourceType = op.getSourceType();
    if (!sourceType.hasStaticShape() || numMultiprocessors == 0)
      return std::nullopt;
    // The runtime's rule (attnres/Bundle/LaunchRules.h), with the default
    // blocks per multiprocessor.
    int64_t resident =
        ::attnres::launch::kDefaultRules.blocksPerMultiprocessor *
        numMultiprocessors;
    int64_t tokens = sourceType.getNumElements() / op.getWidth();
    return ::attnres::launch::backwardBlocks(resident, tokens, minBlockTokens);
  }

  void runOnOperation() override {
    std::optional<int64_t> fixed;
    if (!parseCountOption(blocks, fixed)) {
      emitError(getOperation()->getLoc())
          << "attnres-split-reduction: blocks must be a positive integer or "
             "'auto', got '"
          << blocks << "'";
      return signalPassFailure();
    }
    if (failed(checkMultiprocessorsOption(getOperation()->getLoc(),
                                          "attnres-split-reduction",
                                          numMultiprocessors)))
      return signalPassFailure();
    SmallVector<BackwardOp> backwards;
    getOperation()->walk([&](BackwardOp op) { backwards.push_back(op); });
    IRRewriter rewriter(&getContext());
    for (BackwardOp op : backwards) {
      std::optional<int64_t> count = fixed ? fixed : automaticBlocks(op);
      if (count && failed(splitBackward(rewriter, op, *count)))
        return signalPassFailure();
    }
  }
};

} // namespace
