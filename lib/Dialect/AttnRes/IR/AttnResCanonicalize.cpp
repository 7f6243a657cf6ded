//===- AttnResCanonicalize.cpp - attnres canonicalization patterns --------===//
//
// Rewrites that hold exactly in the math of docs/Math.md, whatever the inputs:
//
// * A forward over one source with no output norm has p = exp(z - lse) = 1,
//   so o is the source itself (lse still needs the logit, so the op stays
//   for it and dies with its last use).
// * The matching backward has ds = scale * (<do, v> - <do, o_pre>) = 0, so
//   the source gradient is do and the query and key-norm gradients are 0.
// * A sum partition_reduce of one partition is that partition.
//
// A softmax partition_reduce of one partition is *not* that partition: an
// empty partition (lse = -inf) must give o = 0 whatever o_p holds, so there is
// no such pattern.
//
//===----------------------------------------------------------------------===//

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::attnres;

/// Converts `value` (a tensor) to `type`: an element-wise float extension or
/// truncation, then a cast to the exact (static/dynamic) shape wanted.
static Value castTensorTo(PatternRewriter &rewriter, Location loc, Value value,
                          RankedTensorType type) {
  auto from = cast<RankedTensorType>(value.getType());
  if (from.getElementType() != type.getElementType()) {
    auto converted = from.clone(type.getElementType());
    if (from.getElementType().getIntOrFloatBitWidth() <
        type.getElementType().getIntOrFloatBitWidth())
      value = arith::ExtFOp::create(rewriter, loc, converted, value);
    else
      value = arith::TruncFOp::create(rewriter, loc, converted, value);
  }
  if (value.getType() != type)
    value = tensor::CastOp::create(rewriter, loc, type, value);
  return value;
}

/// [1, T...] -> [T...]
static Value dropUnitLeadingDim(PatternRewriter &rewriter, Location loc,
                                Value packed) {
  auto type = cast<RankedTensorType>(packed.getType());
  auto target = RankedTensorType::get(type.getShape().drop_front(),
                                      type.getElementType());
  return tensor::createCanonicalRankReducingExtractSliceOp(rewriter, loc,
                                                           packed, target);
}

/// [T...] -> [1, T...] of element type `elementType`.
static Value addUnitLeadingDim(PatternRewriter &rewriter, Location loc,
                               Value value, RankedTensorType target) {
  auto type = cast<RankedTensorType>(value.getType());
  SmallVector<ReassociationIndices> reassociation;
  reassociation.push_back({0, 1});
  for (int64_t dim = 1; dim < type.getRank(); ++dim)
    reassociation.push_back({dim + 1});
  SmallVector<int64_t> shape{1};
  llvm::append_range(shape, type.getShape());
  auto expanded = RankedTensorType::get(shape, type.getElementType());
  Value result = tensor::ExpandShapeOp::create(rewriter, loc, expanded, value,
                                               reassociation);
  return castTensorTo(rewriter, loc, result, target);
}

namespace {

struct ForwardOfOneSource : OpRewritePattern<ForwardOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(ForwardOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getNumSourceValues() != 1 || op.getOutputNormWeight() ||
        op.isMultiQuery() || op.getOutput().use_empty())
      return rewriter.notifyMatchFailure(op, "not a single-query forward over "
                                             "one source without output norm");
    Value source = op.getSources().front();
    if (op.getPacked())
      source = dropUnitLeadingDim(rewriter, op.getLoc(), source);
    Value output =
        castTensorTo(rewriter, op.getLoc(), source, op.getOutput().getType());
    rewriter.replaceAllUsesWith(op.getOutput(), output);
    return success();
  }
};

struct BackwardOfOneSource : OpRewritePattern<BackwardOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(BackwardOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getNumSourceValues() != 1 || op.getOutputNormWeight() ||
        op.isMultiQuery())
      return rewriter.notifyMatchFailure(op, "not a single-query backward over "
                                             "one source without output norm");
    // With one source lse = z, so an lse gradient reaches the query and the
    // key coordinates.
    if (op.getGradLse())
      return rewriter.notifyMatchFailure(op, "the lse has a gradient");
    // The op adds into its source gradients in place (once bufferized);
    // an add here would be a new tensor.
    if (!op.getAccumulated().empty())
      return rewriter.notifyMatchFailure(op, "the op accumulates");
    Location loc = op.getLoc();
    auto gradSourceType =
        cast<RankedTensorType>(op.getGradSources().front().getType());
    Value gradSource =
        op.getPacked()
            ? addUnitLeadingDim(rewriter, loc, op.getGradOutput(),
                                gradSourceType)
            : castTensorTo(rewriter, loc, op.getGradOutput(), gradSourceType);
    auto zeros = [&](Value like) -> Value {
      auto type = cast<RankedTensorType>(like.getType());
      return arith::ConstantOp::create(
          rewriter, loc, type,
          DenseElementsAttr::get(
              type, rewriter.getFloatAttr(type.getElementType(), 0.0)));
    };
    SmallVector<Value> replacements{gradSource, zeros(op.getGradQuery())};
    if (Value gradKeyNorm = op.getGradKeyNormWeight())
      replacements.push_back(zeros(gradKeyNorm));
    rewriter.replaceOp(op, replacements);
    return success();
  }
};

struct SumOfOnePartition : OpRewritePattern<PartitionReduceOp> {
  using OpRewritePattern::OpRewritePattern;

  LogicalResult matchAndRewrite(PartitionReduceOp op,
                                PatternRewriter &rewriter) const override {
    if (op.getKind() != ReduceKind::Sum || op.getNumPartitions() != 1)
      return rewriter.notifyMatchFailure(op, "not a sum of one partition");
    Value partition =
        dropUnitLeadingDim(rewriter, op.getLoc(), op.getPartials());
    rewriter.replaceOp(op, castTensorTo(rewriter, op.getLoc(), partition,
                                        op.getOutput().getType()));
    return success();
  }
};

} // namespace

void ForwardOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                            MLIRContext *context) {
  results.add<ForwardOfOneSource>(context);
}

void BackwardOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                             MLIRContext *context) {
  results.add<BackwardOfOneSource>(context);
}

void PartitionReduceOp::getCanonicalizationPatterns(RewritePatternSet &results,
                                                    MLIRContext *context) {
  results.add<SumOfOnePartition>(context);
}
