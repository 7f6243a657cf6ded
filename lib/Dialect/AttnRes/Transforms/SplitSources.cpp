//===- SplitSources.cpp - forward over L sources -> P partial forwards ----===//

#include "PassOptions.h"
#include "attnres/Bundle/LaunchRules.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"
#include "attnres/Dialect/AttnRes/Transforms/Passes.h"
#include "attnres/Dialect/AttnRes/Utils/Reshape.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESSPLITSOURCES
#include "attnres/Dialect/AttnRes/Transforms/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;

namespace {

/// Stacks same-typed tensors along a new leading dimension.
Value stack(OpBuilder &b, Location loc, ArrayRef<Value> values) {
  SmallVector<Value> rows;
  for (Value value : values)
    rows.push_back(flattenDims(b, loc, value, 0, 0));
  return tensor::ConcatOp::create(b, loc, /*dim=*/0, rows);
}

void splitForward(IRRewriter &rewriter, ForwardOp op, int64_t partitions) {
  Location loc = op.getLoc();
  rewriter.setInsertionPoint(op);
  int64_t numSources = op.getNumSourceValues();
  Type f32 = rewriter.getF32Type();
  auto partialType = op.getOutput().getType().clone(f32);

  SmallVector<Value> partialOutputs, partialLses;
  // Partition p holds sources [floor(p * L / P), floor((p + 1) * L / P)),
  // as the split forward kernels walk them (blockIdx.y = p).
  for (int64_t p = 0; p < partitions; ++p) {
    int64_t start = p * numSources / partitions;
    int64_t count = (p + 1) * numSources / partitions - start;
    SmallVector<Value> sources;
    if (op.getPacked()) {
      Value packed = op.getSources().front();
      SmallVector<OpFoldResult> offsets(
          cast<RankedTensorType>(packed.getType()).getRank(),
          rewriter.getIndexAttr(0));
      offsets[0] = rewriter.getIndexAttr(start);
      SmallVector<OpFoldResult> sizes =
          tensor::getMixedSizes(rewriter, loc, packed);
      sizes[0] = rewriter.getIndexAttr(count);
      SmallVector<OpFoldResult> strides(offsets.size(),
                                        rewriter.getIndexAttr(1));
      sources.push_back(tensor::ExtractSliceOp::create(
          rewriter, loc, packed, offsets, sizes, strides));
    } else {
      llvm::append_range(sources, op.getSources().slice(start, count));
    }
    auto partial = ForwardOp::create(
        rewriter, loc, partialType, op.getLse().getType(), /*o_pre=*/Type(),
        /*o_pre_residual=*/Type(), sources, op.getPackedAttr(), op.getQuery(),
        op.getKeyNormWeight(),
        /*output_norm_weight=*/Value(), op.getEpsAttr(), op.getScaleAttr(),
        SaveModeAttr::get(rewriter.getContext(), SaveMode::Lse));
    partialOutputs.push_back(partial.getOutput());
    partialLses.push_back(partial.getLse());
  }

  Value partials = stack(rewriter, loc, partialOutputs);
  Value lses = stack(rewriter, loc, partialLses);
  auto typeOf = [](Value value) { return value ? value.getType() : Type(); };
  // The merge returns what the forward saved: o_pre (with an output norm)
  // and the residual of its rounding.
  auto merge = PartitionReduceOp::create(
      rewriter, loc, op.getOutput().getType(), op.getLse().getType(),
      typeOf(op.getOPre()), typeOf(op.getOPreResidual()),
      ReduceKindAttr::get(rewriter.getContext(), ReduceKind::Softmax), partials,
      lses, /*sink=*/Value(), op.getOutputNormWeight(), op.getEpsAttr());
  rewriter.replaceOp(op, merge.getResults());
}

struct SplitSourcesPass
    : mlir::attnres::impl::AttnResSplitSourcesBase<SplitSourcesPass> {
  using Base::Base;

  /// The rule documented in Passes.td for partitions=auto; 1 (whole) where
  /// the token count is dynamic or the target's size is left to run time.
  int64_t automaticPartitions(ForwardOp op) {
    RankedTensorType sourceType = op.getSourceType();
    if (!sourceType.hasStaticShape() || numMultiprocessors == 0)
      return 1;
    int64_t tokens = sourceType.getNumElements() / op.getWidth();
    int64_t rows = std::max<int64_t>(1, tokens * op.getNumQueries());
    int64_t numSources = op.getNumSourceValues();
    int64_t elementBytes =
        sourceType.getElementType().getIntOrFloatBitWidth() / 8;
    // The runtime's rule (attnres/Bundle/LaunchRules.h), with a block a row
    // and the default blocks per multiprocessor.
    ::attnres::launch::Rules rules;
    rules.partitionBytes = minPartitionBytes;
    return ::attnres::launch::forwardPartitions(
        rules.blocksPerMultiprocessor * numMultiprocessors, rows, numSources,
        numSources * op.getWidth() * elementBytes, rules);
  }

  void runOnOperation() override {
    std::optional<int64_t> fixed;
    if (!parseCountOption(partitions, fixed)) {
      emitError(getOperation()->getLoc())
          << "attnres-split-sources: partitions must be a positive integer "
             "or 'auto', got '"
          << partitions << "'";
      return signalPassFailure();
    }
    if (failed(checkMultiprocessorsOption(getOperation()->getLoc(),
                                          "attnres-split-sources",
                                          numMultiprocessors)))
      return signalPassFailure();
    SmallVector<ForwardOp> forwards;
    getOperation()->walk([&](ForwardOp op) { forwards.push_back(op); });
    IRRewriter rewriter(&getContext());
    for (ForwardOp op : forwards) {
      int64_t count = fixed ? *fixed : automaticPartitions(op);
      count = std::min(count, op.getNumSourceValues());
      // One partition asked for is kept: one FP32 partial and the merge
      // (the decomposition the GPU then runs unsplit).
      if (count > 1 || (fixed && *fixed == 1))
        splitForward(rewriter, op, count);
    }
  }
};

} // namespace
