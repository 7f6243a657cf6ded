//===- Tile.cpp - tile attnres ops over tokens into scf.forall ------------===//

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"
#include "attnres/Dialect/AttnRes/Transforms/Passes.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/Transforms/TileUsingInterface.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESTILE
#include "attnres/Dialect/AttnRes/Transforms/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;

namespace {

struct TilePass : attnres::impl::AttnResTileBase<TilePass> {
  using Base::Base;

  void runOnOperation() override {
    if (llvm::any_of(tileSizes, [](int64_t size) { return size < 0; })) {
      emitError(getOperation()->getLoc())
          << "attnres-tile: tile sizes must be >= 0";
      return signalPassFailure();
    }
    SmallVector<TilingInterface> ops;
    // A sum partition_reduce adds partial rows elementwise (the partial
    // gradients of attnres-split-reduction, say): its dimensions are not
    // tokens, so token tile sizes do not apply to it.
    getOperation()->walk([&](Operation *op) {
      auto reduce = dyn_cast<PartitionReduceOp>(op);
      if (isa<ForwardOp>(op) ||
          (reduce && reduce.getKind() == ReduceKind::Softmax))
        ops.push_back(cast<TilingInterface>(op));
    });
    IRRewriter rewriter(&getContext());
    for (TilingInterface op : ops) {
      size_t numDims = op.getLoopIteratorTypes().size();
      SmallVector<int64_t> sizes(tileSizes.begin(), tileSizes.end());
      sizes.resize(numDims, 0);
      if (llvm::all_of(sizes, [](int64_t size) { return size == 0; }))
        continue;
      scf::SCFTilingOptions options;
      options.setLoopType(scf::SCFTilingOptions::LoopType::ForallOp);
      options.setTileSizes(getAsIndexOpFoldResult(&getContext(), sizes));
      rewriter.setInsertionPoint(op);
      FailureOr<scf::SCFTilingResult> tiled =
          scf::tileUsingSCF(rewriter, op, options);
      if (failed(tiled)) {
        op->emitError("attnres-tile: tiling failed");
        return signalPassFailure();
      }
      rewriter.replaceOp(op, tiled->replacements);
    }
  }
};

} // namespace
