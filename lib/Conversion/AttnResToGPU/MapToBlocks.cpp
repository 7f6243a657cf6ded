//===- MapToBlocks.cpp - map the split and tile loops to GPU blocks -------===//
//
// Writes down, as upstream scf.forall mapping attributes, how
// convert-attnres-to-gpu runs the loops of attnres-tile and
// attnres-split-reduction: one block per iteration. The conversion checks
// the attribute against the same blockMapping.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESMAPTOBLOCKS
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;

namespace {

struct MapToBlocksPass
    : mlir::attnres::impl::AttnResMapToBlocksBase<MapToBlocksPass> {
  void runOnOperation() override {
    getOperation()->walk([](scf::ForallOp loop) {
      if (loop.getMapping())
        return;
      Operation *only = nullptr;
      for (Operation &op : loop.getBody()->without_terminator()) {
        if (!isa<ForwardOp, BackwardOp, PartitionReduceOp>(op))
          continue;
        if (only)
          return;
        only = &op;
      }
      auto reduce = dyn_cast_or_null<PartitionReduceOp>(only);
      if (!only || (reduce && reduce.getKind() != ReduceKind::Softmax))
        return;
      bool tiled = !isa<BackwardOp>(only);
      loop.setMappingAttr(gpu_kernels::blockMapping(
          loop.getContext(), loop.getRank(), /*linear=*/tiled));
    });
  }
};

} // namespace
