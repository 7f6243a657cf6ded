//===- LowerTiles.cpp - a tile loop as a grid of blocks -------------------===//
//
// attnres-lower-tiles-to-gpu: after attnres-bufferize-host, a forward's,
// backward's or softmax merge's tile loop is an scf.forall whose body takes
// views of the function's buffers, one tile an iteration (a backward's
// tile: attnres-split-reduction's block of tokens, with its own row of each
// partial gradient). Upstream's loop mappings make it a gpu.launch (one
// block an iteration); the tile's op in the launch body becomes the thread
// code of its kernel over the tile's rows, and the host code before the
// launch what that code reads (the tables of source rows, the buffers'
// addresses) and the alignment checks of its accesses.
// gpu-kernel-outlining then makes the launch a kernel.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Conversion/SCFToGPU/SCFToGPU.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/ParallelLoopMapper.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/Transforms.h"
#include "mlir/Dialect/SCF/Utils/Utils.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Transforms/DialectConversion.h"

#include <functional>
#include <numeric>

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESLOWERTILESTOGPU
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::attnres::gpu_kernels;

namespace {

constexpr StringLiteral kPass = "attnres-lower-tiles-to-gpu";

/// Checks that a tile loop's body is one op the pass lowers and what may
/// run next to it, else an error naming the first op of the body that
/// cannot run on the device.
LogicalResult checkTileLoop(scf::ForallOp loop) {
  if (loop.getNumResults() != 0)
    return loop.emitError()
           << kPass
           << ": the tile loop has tensor outputs; bufferize it first "
              "(attnres-bufferize-host)";
  bool found = false;
  for (Operation &op : loop.getBody()->without_terminator()) {
    if (isLoweredTileOp(&op) && !found) {
      found = true;
      continue;
    }
    if (isa<memref::SubViewOp, memref::DimOp>(op) || isIndexArithmetic(&op))
      continue;
    return op.emitError()
           << kPass
           << ": a tile loop runs on the device as a grid of blocks; its "
              "body may hold one attnres.forward_into, backward_into or "
              "softmax attnres.partition_reduce_into, views of buffers and "
              "index arithmetic; '"
           << op.getName() << "' is none of them";
  }
  return success();
}

/// A backward's tile writes one row of each partial gradient, its own: the
/// loop has one dimension, whose index is the row of the tile's views of
/// them (two tiles writing one row would race).
LogicalResult checkPartialRows(scf::ForallOp loop) {
  for (Operation &op : loop.getBody()->without_terminator()) {
    auto backward = dyn_cast<BackwardIntoOp>(op);
    if (!backward)
      continue;
    for (Value partial :
         {backward.getGradQueryBuffer(), backward.getGradKeyNormWeightBuffer(),
          backward.getGradOutputNormWeightBuffer()}) {
      if (!partial)
        continue;
      auto subview = partial.getDefiningOp<memref::SubViewOp>();
      Value row = subview ? dyn_cast<Value>(subview.getMixedOffsets().front())
                          : Value();
      if (loop.getRank() != 1 || !row || row != loop.getInductionVar(0))
        return backward.emitError()
               << kPass
               << ": a backward's tile writes its own row of each partial "
                  "gradient: the loop must have one dimension, and its "
                  "index must be the row of the tile's views of them";
      // Where both are known, the rows the loop's indices name are rows of
      // the buffer.
      std::optional<int64_t> end =
          getConstantIntValue(loop.getMixedUpperBound().front());
      auto rows = cast<MemRefType>(subview.getSource().getType());
      if (end && isOneInteger(loop.getMixedStep().front()) &&
          !rows.isDynamicDim(0) && *end > rows.getDimSize(0))
        return backward.emitError()
               << kPass << ": the loop's indices run up to " << *end
               << " (exclusive), past the " << rows.getDimSize(0)
               << " rows of a partial gradient's buffer";
    }
  }
  return success();
}

/// The loop as a gpu.launch of one block an iteration, through upstream's
/// mappings: scf.parallel, its dimensions collapsed into one (a grid's x
/// holds 2^31 - 1 blocks, y and z 65535), mapped to the blocks.
FailureOr<gpu::LaunchOp> launchOf(scf::ForallOp loop) {
  MLIRContext *context = loop.getContext();
  IRRewriter rewriter(context);
  rewriter.setInsertionPoint(loop);
  Block *block = loop->getBlock();
  Operation *next = loop->getNextNode();
  scf::ParallelOp parallel;
  if (failed(scf::forallToParallelLoop(rewriter, loop, &parallel)))
    return loop.emitError() << kPass
                            << ": cannot make the tile loop an "
                               "scf.parallel";
  if (parallel.getNumLoops() > 1) {
    std::vector<unsigned> all(parallel.getNumLoops());
    std::iota(all.begin(), all.end(), 0);
    collapseParallelLoops(rewriter, parallel, {all});
    parallel = cast<scf::ParallelOp>(next->getPrevNode());
  }
  AffineMap identity = AffineMap::getMultiDimIdentityMap(1, context);
  if (failed(gpu::setMappingAttr(
          parallel, {gpu::ParallelLoopDimMappingAttr::get(
                        context, gpu::Processor::BlockX, identity, identity)})))
    return parallel.emitError()
           << kPass << ": cannot map the tile loop to the GPU's blocks";
  RewritePatternSet patterns(context);
  populateParallelLoopToGPUPatterns(patterns);
  ConversionTarget target(*context);
  target.markUnknownOpDynamicallyLegal([](Operation *) { return true; });
  configureParallelLoopToGPULegality(target);
  Operation *function = parallel->getParentOp();
  if (failed(applyPartialConversion(function, target, std::move(patterns))))
    return parallel.emitError() << kPass
                                << ": cannot map the tile loop to "
                                   "the GPU's blocks";
  finalizeParallelLoopToGPUConversion(function);
  auto launch = dyn_cast_or_null<gpu::LaunchOp>(next ? next->getPrevNode()
                                                     : &block->back());
  if (!launch)
    return function->emitError() << kPass << ": the tile loop made no launch";
  return launch;
}

/// The sizes the launch body reads of buffers the host holds are the
/// host's: the launch captures them, not the buffers.
void hoistHostSizes(gpu::LaunchOp launch) {
  SmallVector<memref::DimOp> sizes;
  launch.getBody().walk([&](memref::DimOp dim) {
    if (!launch->isAncestor(dim.getSource().getParentBlock()->getParentOp()))
      sizes.push_back(dim);
  });
  for (memref::DimOp dim : sizes) {
    Value index = dim.getIndex();
    if (launch->isAncestor(index.getParentBlock()->getParentOp())) {
      Operation *constant = index.getDefiningOp();
      if (!constant || !constant->hasTrait<OpTrait::ConstantLike>())
        continue;
      OpBuilder b(launch);
      dim.getIndexMutable().assign(b.clone(*constant)->getResult(0));
    }
    dim->moveBefore(launch);
  }
}

/// How a tile lies in a buffer of the launch's function: a view
/// (memref.subview) of `root`, the whole buffer, at `offsets` with `sizes`.
struct View {
  Value root;
  SmallVector<OpFoldResult> offsets, sizes;
};

/// The tile of the op `tile`: consecutive rows [first, first + count) of
/// the whole buffers of every operand it writes or reads per token, the
/// others whole; the op over the whole buffers is `whole`, made before the
/// launch.
struct TileRows {
  Operation *whole;
  Value first, count; // i64, in the launch body before the tile's op
  /// Token dimensions of the whole buffers that must be equal, which only
  /// the run time knows (index values before the launch), with what each
  /// pair is.
  SmallVector<std::tuple<Value, Value, std::string>> equalSizes;
  /// A backward's tile: the row it writes of the partial gradients (an
  /// index in the launch body).
  OpFoldResult tileRow;
};

bool isConstant(OpFoldResult value, int64_t constant) {
  std::optional<int64_t> known = getConstantIntValue(value);
  return known && *known == constant;
}

bool sameValue(OpFoldResult a, OpFoldResult b) {
  if (a == b)
    return true;
  std::optional<int64_t> x = getConstantIntValue(a), y = getConstantIntValue(b);
  return x && y && *x == *y;
}

/// Whether `size` is all of dimension `dim` of `root`: its static size, or
/// a memref.dim of it (or of another buffer of the op with the same
/// token dimension `dim - lead + otherLead`).
bool isWholeDim(OpFoldResult size, Value root, int64_t dim,
                ArrayRef<std::pair<Value, int64_t>> rootsAndLeads,
                int64_t lead) {
  auto type = cast<MemRefType>(root.getType());
  if (!type.isDynamicDim(dim))
    return isConstant(size, type.getDimSize(dim));
  auto sizeDim = dyn_cast_if_present<Value>(size)
                     ? cast<Value>(size).getDefiningOp<memref::DimOp>()
                     : memref::DimOp();
  if (!sizeDim)
    return false;
  std::optional<int64_t> index = sizeDim.getConstantIndex();
  if (!index)
    return false;
  for (auto [other, otherLead] : rootsAndLeads)
    if (sizeDim.getSource() == other && *index == dim - lead + otherLead)
      return true;
  return false;
}

/// An operand of a tile's op with token dimensions: its leading dimensions
/// (a packed forward's sources, a multi-query forward's queries, a merge's
/// partitions), then token dimensions (the first of them at least; all of
/// the op's where it is the first operand), then `trail` trailing ones (a
/// row).
struct Tiled {
  Value value;
  StringRef name;
  int64_t lead, trail;
  /// Whether the whole buffer's token counts are checked here against the
  /// first operand's (not where the op's host code checks them itself).
  bool checkTokens = true;
};

/// The operands of `tile` with token dimensions, the first the one whose
/// token dimensions are the op's (a forward's or backward's first source, a
/// merge's partials), the operands it reads whole, the same for every tile,
/// and those of which it writes one row (a split backward's partial
/// gradients).
void tileOperandsOf(Operation *tile, SmallVectorImpl<Tiled> &tiled,
                    SmallVectorImpl<Value> &whole,
                    SmallVectorImpl<std::pair<Value, StringRef>> &rows) {
  auto addOutputs = [&](Value o, Value lse, Value oPre, Value residual,
                        int64_t lead) {
    tiled.push_back({o, "o", lead, 1});
    tiled.push_back({lse, "lse", lead, 0});
    if (oPre)
      tiled.push_back({oPre, "o_pre", lead, 1});
    if (residual)
      tiled.push_back({residual, "the o_pre residual", lead, 1});
  };
  if (auto forward = dyn_cast<ForwardIntoOp>(tile)) {
    for (Value source : forward.getSources())
      tiled.push_back({source, "the sources", forward.getPacked() ? 1 : 0, 1});
    addOutputs(forward.getOutputBuffer(), forward.getLseBuffer(),
               forward.getOPreBuffer(), forward.getOPreResidualBuffer(),
               forward.isMultiQuery() ? 1 : 0);
    llvm::append_range(whole,
                       SmallVector<Value>{forward.getQuery(),
                                          forward.getKeyNormWeight(),
                                          forward.getOutputNormWeight()});
    return;
  }
  if (auto backward = dyn_cast<BackwardIntoOp>(tile)) {
    int64_t lead = backward.getPacked() ? 1 : 0;
    for (Value source : backward.getSources())
      tiled.push_back({source, "the sources", lead, 1});
    int64_t queries = backward.isMultiQuery() ? 1 : 0;
    tiled.push_back(
        {backward.getGradOutput(), "the output gradient", queries, 1});
    tiled.push_back({backward.getLse(), "lse", queries, 0});
    if (Value saved = backward.getSavedOutput())
      tiled.push_back({saved, "the saved o_pre", queries, 1});
    if (Value residual = backward.getSavedResidual())
      tiled.push_back({residual, "the saved residual", queries, 1});
    if (Value gradLse = backward.getGradLse())
      tiled.push_back({gradLse, "the lse gradient", queries, 0});
    for (Value gradient : backward.getGradSourceBuffers())
      tiled.push_back({gradient, "the source gradients", lead, 1});
    llvm::append_range(whole,
                       SmallVector<Value>{backward.getQuery(),
                                          backward.getKeyNormWeight(),
                                          backward.getOutputNormWeight()});
    rows.emplace_back(backward.getGradQueryBuffer(), "the query gradient");
    if (Value dg = backward.getGradKeyNormWeightBuffer())
      rows.emplace_back(dg, "the key norm weight's gradient");
    if (Value dh = backward.getGradOutputNormWeightBuffer())
      rows.emplace_back(dh, "the output norm weight's gradient");
    return;
  }
  auto merge = cast<PartitionReduceIntoOp>(tile);
  tiled.push_back({merge.getPartials(), "the partials", 1, 1});
  tiled.push_back({merge.getPartialLse(), "the partial lses", 1, 0});
  if (Value sink = merge.getSink())
    tiled.push_back({sink, "the sink", 0, 0});
  // A [K, D] weight follows the first token dimension (its tiling slices
  // it so), K checked by the merge's host code (mergeArguments) and, when
  // static, by the op's verifier; a [D] one is whole.
  Value weight = merge.getOutputNormWeight();
  if (weight && cast<MemRefType>(weight.getType()).getRank() == 2)
    tiled.push_back({weight, "the output norm weight", 0, 1,
                     /*checkTokens=*/false});
  else
    whole.push_back(weight);
  addOutputs(merge.getOutputBuffer(), merge.getLseBuffer(),
             merge.getOPreBuffer(), merge.getOPreResidualBuffer(), 0);
}

/// Whether dimension `dim` of `buffer` is dimension `otherDim` of `other`
/// by construction: `buffer` allocated with that size (as bufferization
/// allocates a tile loop's outputs from the sizes of its inputs).
bool allocatedWith(Value buffer, int64_t dim, Value other, int64_t otherDim) {
  Value size = madeWithSize(buffer, dim);
  auto read = size ? size.getDefiningOp<memref::DimOp>() : memref::DimOp();
  return read && read.getSource() == other &&
         read.getConstantIndex() == otherDim;
}

FailureOr<TileRows> tileRowsOf(gpu::LaunchOp launch, Operation *tile) {
  auto fail = [&](const Twine &what) {
    return tile->emitError()
           << kPass
           << ": a tile must be consecutive rows of its buffers: " << what;
  };
  auto isInLaunch = [&](Value value) {
    return launch->isAncestor(value.getParentBlock()->getParentOp());
  };
  SmallVector<Tiled> tiled;
  SmallVector<Value> wholeOperands;
  SmallVector<std::pair<Value, StringRef>> tileRowOperands;
  tileOperandsOf(tile, tiled, wholeOperands, tileRowOperands);

  // Every other operand is read whole, the same for every tile, from its
  // first element.
  for (Value operand : wholeOperands)
    if (operand &&
        (isInLaunch(operand) ||
         !cast<MemRefType>(operand.getType()).getLayout().isIdentity()))
      return fail(!isa<PartitionReduceIntoOp>(tile)
                      ? "the query and the norm weights must be whole "
                        "buffers, dense from their start (an identity "
                        "layout), the same for every tile"
                      : "a [D] output norm weight must be a whole buffer, "
                        "dense from its start (an identity layout), the "
                        "same for every tile");

  SmallVector<View> views;
  for (const Tiled &operand : tiled) {
    auto subview = operand.value.getDefiningOp<memref::SubViewOp>();
    if (!subview || !isInLaunch(operand.value))
      return fail(operand.name + " must be views (memref.subview) of the "
                                 "function's buffers, a tile each");
    Value root = subview.getSource();
    if (isInLaunch(root))
      return fail(operand.name + " must be views of the function's buffers, "
                                 "not of views in the loop");
    // A root may itself be a view of consecutive rows (a packed source's
    // partition, a partial forward's piece of its stack): the host
    // addresses it from its first element.
    if (!isDenseView(root)) {
      fail(operand.name + " must be views of buffers whose elements lie "
                          "one after the other (an identity layout, or "
                          "consecutive rows of such a buffer), not of ")
          << root.getType();
      return failure();
    }
    if (!llvm::all_of(subview.getMixedStrides(),
                      [](OpFoldResult s) { return isConstant(s, 1); }))
      return fail(operand.name + " must be views with unit strides");
    views.push_back({root, subview.getMixedOffsets(), subview.getMixedSizes()});
  }
  SmallVector<std::pair<Value, int64_t>> rootsAndLeads;
  for (auto [operand, view] : llvm::zip_equal(tiled, views))
    rootsAndLeads.emplace_back(view.root, operand.lead);

  // The first operand's token offsets and sizes are every operand's; its
  // leading and trailing dimensions are whole.
  const View &first = views.front();
  int64_t tokenDims = cast<MemRefType>(first.root.getType()).getRank() -
                      tiled.front().lead - tiled.front().trail;
  for (auto [operand, view] : llvm::zip_equal(tiled, views)) {
    int64_t rank = cast<MemRefType>(view.root.getType()).getRank();
    for (int64_t dim = 0; dim < rank; ++dim) {
      bool token = dim >= operand.lead && dim < rank - operand.trail;
      if (!token) {
        if (!isConstant(view.offsets[dim], 0) ||
            !isWholeDim(view.sizes[dim], view.root, dim,
                        {{view.root, operand.lead}}, operand.lead))
          return fail(operand.name + " must be whole in dimension " +
                      Twine(dim) + ", which is not a token dimension");
        continue;
      }
      int64_t k = dim - operand.lead;
      int64_t firstDim = tiled.front().lead + k;
      bool bothWhole = isConstant(view.offsets[dim], 0) &&
                       isConstant(first.offsets[firstDim], 0) &&
                       isWholeDim(view.sizes[dim], view.root, dim,
                                  rootsAndLeads, operand.lead) &&
                       isWholeDim(first.sizes[firstDim], first.root, firstDim,
                                  rootsAndLeads, tiled.front().lead);
      if (!bothWhole &&
          (!sameValue(view.offsets[dim], first.offsets[firstDim]) ||
           !sameValue(view.sizes[dim], first.sizes[firstDim])))
        return fail(operand.name + " must be the same tile of tokens as " +
                    tiled.front().name + " (token dimension " + Twine(k) + ")");
    }
  }

  // The kernel addresses every buffer's rows as the first operand's
  // (query m's row r at m * N + r, partition p's at p * N + r): the whole
  // buffers' token dimensions must be the first operand's. Static ones are
  // compared here, the others before the launch.
  OpBuilder host(launch);
  Location loc = tile->getLoc();
  TileRows result;
  StringRef firstName = tiled.front().name;
  for (auto [operand, view] : llvm::zip_equal(tiled, views)) {
    auto type = cast<MemRefType>(view.root.getType());
    auto firstType = cast<MemRefType>(first.root.getType());
    int64_t operandTokenDims = type.getRank() - operand.lead - operand.trail;
    if (!operand.checkTokens)
      continue;
    for (int64_t k = 0; k < operandTokenDims; ++k) {
      int64_t dim = operand.lead + k, firstDim = tiled.front().lead + k;
      if (view.root == first.root && dim == firstDim)
        continue;
      if (!type.isDynamicDim(dim) && !firstType.isDynamicDim(firstDim)) {
        if (type.getDimSize(dim) != firstType.getDimSize(firstDim))
          return fail("the buffer of " + operand.name + " has " +
                      Twine(type.getDimSize(dim)) + " tokens in token " +
                      "dimension " + Twine(k) + ", " + firstName + "' " +
                      Twine(firstType.getDimSize(firstDim)));
        continue;
      }
      if (allocatedWith(view.root, dim, first.root, firstDim) ||
          allocatedWith(first.root, firstDim, view.root, dim))
        continue;
      result.equalSizes.emplace_back(
          memref::DimOp::create(host, loc, view.root, dim),
          memref::DimOp::create(host, loc, first.root, firstDim),
          ("the buffer of " + operand.name + " (token dimension " + Twine(k) +
           ") must have as many tokens as " + firstName + "'")
              .str());
    }
  }

  // Consecutive rows: the last token dimension the tile cuts, the ones
  // before it by one token, the ones after whole.
  int64_t lead = tiled.front().lead;
  auto isWhole = [&](int64_t k) {
    return isConstant(first.offsets[lead + k], 0) &&
           isWholeDim(first.sizes[lead + k], first.root, lead + k,
                      rootsAndLeads, lead);
  };
  int64_t cut = tokenDims - 1;
  while (cut >= 0 && isWhole(cut))
    --cut;
  for (int64_t k = 0; k < cut; ++k)
    if (!isConstant(first.sizes[lead + k], 1))
      return fail("token dimension " + Twine(k) +
                  " must be tiled by 1, as the tile cuts a later one");

  // first = sum of offset_k * (rows of a step of dimension k); count = the
  // cut dimension's size times the rows of one of its steps. The sizes of
  // the whole buffers are the host's.
  SmallVector<Value> stepRows(tokenDims);
  Value rows = arith::ConstantIndexOp::create(host, loc, 1);
  for (int64_t k = tokenDims - 1; k >= 0; --k) {
    stepRows[k] = rows;
    Value size = memref::DimOp::create(host, loc, first.root, lead + k);
    rows = arith::MulIOp::create(host, loc, rows, size);
  }
  OpBuilder body(tile);
  auto asValue = [&](OpFoldResult value) {
    return getValueOrCreateConstantIndexOp(body, loc, value);
  };
  Value firstRow = arith::ConstantIndexOp::create(body, loc, 0);
  for (int64_t k = 0; k < tokenDims; ++k)
    firstRow = arith::AddIOp::create(
        body, loc, firstRow,
        arith::MulIOp::create(body, loc, asValue(first.offsets[lead + k]),
                              stepRows[k]));
  Value count =
      cut < 0 ? rows
              : arith::MulIOp::create(
                    body, loc, asValue(first.sizes[lead + cut]), stepRows[cut]);
  // A tile past the last token (more tile numbers than tiles) is empty.
  count = arith::MaxSIOp::create(body, loc, count,
                                 arith::ConstantIndexOp::create(body, loc, 0));
  auto toI64 = [&](Value index) {
    return arith::IndexCastOp::create(body, loc, body.getI64Type(), index);
  };
  result.first = toI64(firstRow);
  result.count = toI64(count);

  // A backward's tile writes one row of each partial gradient: the same
  // row of each, a view of a dense buffer's [1, ...] slice at that row,
  // whole in the other dimensions. The op over the whole buffers takes
  // their first rows (the same type), the kernel's stores offset by the
  // tile's row.
  IRMapping whole;
  auto failRow = [&](const Twine &name) {
    return tile->emitError()
           << kPass << ": " << name
           << " must be one row of a dense buffer of the function (a "
              "memref.subview of its [1, ...] slice, whole in every other "
              "dimension, unit strides), the tile's own";
  };
  for (auto [value, name] : tileRowOperands) {
    auto subview = value.getDefiningOp<memref::SubViewOp>();
    if (!subview || !isInLaunch(value) || isInLaunch(subview.getSource()))
      return failRow(name);
    Value root = subview.getSource();
    auto rootType = cast<MemRefType>(root.getType());
    SmallVector<OpFoldResult> offsets = subview.getMixedOffsets(),
                              sizes = subview.getMixedSizes();
    bool oneRow =
        isDenseView(root) &&
        rootType.getRank() == cast<MemRefType>(value.getType()).getRank() + 1 &&
        isConstant(sizes[0], 1) &&
        llvm::all_of(subview.getMixedStrides(),
                     [](OpFoldResult s) { return isConstant(s, 1); });
    for (int64_t dim = 1; oneRow && dim < rootType.getRank(); ++dim)
      oneRow = isConstant(offsets[dim], 0) &&
               isWholeDim(sizes[dim], root, dim, {{root, 0}}, 0);
    if (!oneRow)
      return failRow(name);
    // One row for all (checkPartialRows: each the loop's index).
    result.tileRow = offsets[0];
    // The first row, at a dynamic offset (the type of the tile's row), its
    // sizes the host's: constants, or sizes of the buffer read before the
    // launch (hoistHostSizes).
    SmallVector<OpFoldResult> firstRow(offsets.size(), host.getIndexAttr(0));
    firstRow[0] = arith::ConstantIndexOp::create(host, loc, 0).getResult();
    SmallVector<OpFoldResult> hostSizes,
        unitStrides(offsets.size(), host.getIndexAttr(1));
    for (OpFoldResult size : sizes) {
      std::optional<int64_t> known = getConstantIntValue(size);
      if (!known && isInLaunch(cast<Value>(size)))
        return failRow(name);
      hostSizes.push_back(known ? host.getIndexAttr(*known) : size);
    }
    whole.map(value, memref::SubViewOp::create(
                         host, loc, cast<MemRefType>(value.getType()), root,
                         firstRow, hostSizes, unitStrides));
  }

  // The op over the whole buffers: the tile's op with each view's buffer
  // in its place.
  for (auto [operand, view] : llvm::zip_equal(tiled, views))
    whole.map(operand.value, view.root);
  result.whole = host.clone(*tile, whole);
  return result;
}

/// The number after the last refusal message the module's host code
/// already has (attnres-launch-kernels' attnres_refusal_<n>).
unsigned existingRefusals(ModuleOp module) {
  unsigned last = 0;
  for (Operation &op : module.getBody()->getOperations()) {
    auto symbol =
        op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName());
    if (!symbol)
      continue;
    StringRef name = symbol.getValue();
    unsigned number;
    if (name.consume_front("attnres_refusal_") &&
        !name.getAsInteger(10, number))
      last = std::max(last, number);
  }
  return last;
}

struct LowerTilesPass
    : mlir::attnres::impl::AttnResLowerTilesToGPUBase<LowerTilesPass> {
  using Base::Base;

  /// The options, as convert-attnres-to-gpu holds its own.
  LogicalResult checkOptions(Location loc) {
    auto fail = [&](const Twine &what) {
      return emitError(loc) << getArgument() << ": " << what;
    };
    if (subgroupSize < 1 || !llvm::isPowerOf2_64(subgroupSize) ||
        maxBlockThreads < subgroupSize)
      return fail("subgroup-size must be a power of two no larger than "
                  "max-block-threads");
    if (forwardSourceBatch < 0 || unrollSources < 0 || forwardThreadsPerRow < 0)
      return fail("forward-source-batch, unroll-sources and "
                  "forward-threads-per-row must be >= 0");
    if (forwardPrefetch < -1 || forwardPrefetch > 1)
      return fail("forward-prefetch must be -1 (chosen), 0 or 1");
    if (forwardStagedBatches < 0 || forwardStagedBatches > 8)
      return fail("forward-staged-batches must be in [0, 8]");
    if (forwardStagedBatches > 0 && !asyncCopies)
      return fail("staged batches need asynchronous copies (async-copies=1: "
                  "NVIDIA sm_80 and later)");
    if (mergeLoadsInFlight < 0)
      return fail("merge-loads-in-flight must be >= 0");
    if (backwardSourceBatch < 0 || backwardThreadsPerRow < 0)
      return fail("backward-source-batch and backward-threads-per-row must "
                  "be >= 0");
    if (backwardPrefetch < -1 || backwardPrefetch > 1)
      return fail("backward-prefetch must be -1 (chosen), 0 or 1");
    if (backwardStagedBatches < -1 || backwardStagedBatches > 8)
      return fail("backward-staged-batches must be in [-1, 8]");
    if (backwardStagedBatches > 0 && !asyncCopies)
      return fail("staged batches need asynchronous copies (async-copies=1: "
                  "NVIDIA sm_80 and later)");
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkOptions(module.getLoc())))
      return signalPassFailure();
    KernelChoices choices = KernelChoices{
        subgroupSize,         maxBlockThreads,       unrollSources,
        forwardThreadsPerRow, forwardSourceBatch,    forwardPrefetch,
        forwardStagedBatches, backwardThreadsPerRow, backwardSourceBatch,
        backwardPrefetch,     backwardStagedBatches, asyncCopies};

    SmallVector<scf::ForallOp> loops;
    for (auto function : module.getOps<func::FuncOp>())
      for (Block &block : function.getBody())
        for (auto loop : block.getOps<scf::ForallOp>())
          if (llvm::any_of(loop.getBody()->without_terminator(),
                           [](Operation &op) { return isLoweredTileOp(&op); }))
            loops.push_back(loop);
    unsigned refusals = existingRefusals(module);
    for (scf::ForallOp loop : loops)
      if (failed(lower(loop, choices, refusals)))
        return signalPassFailure();
  }

  LogicalResult lower(scf::ForallOp loop, const KernelChoices &choices,
                      unsigned &refusals) {
    if (failed(checkTileLoop(loop)) || failed(checkPartialRows(loop)))
      return failure();
    // The iterations run as the blocks of one grid dimension; a loop mapped
    // otherwise (to threads, say) asks for what this does not do.
    if (std::string mapped; !hasRealizedMapping(loop, /*linear=*/true, mapped))
      return loop.emitError() << kPass << ": " << mapped;
    std::string kernel =
        (loop->getParentOfType<func::FuncOp>().getSymName() + "_kernel").str();
    FailureOr<gpu::LaunchOp> launch = launchOf(loop);
    if (failed(launch))
      return failure();
    hoistHostSizes(*launch);
    Operation *tile = nullptr;
    launch->getBody().walk([&](Operation *op) {
      if (isLoweredTileOp(op))
        tile = op;
    });
    if (!tile || tile->getParentOp() != *launch)
      return launch->emitError()
             << kPass << ": the tile's op is not at the top of its launch";
    FailureOr<TileRows> rows = tileRowsOf(*launch, tile);
    if (failed(rows))
      return failure();

    // The tile's op over the whole buffers is an op like any (its shapes
    // the tile's).
    if (failed(mlir::verify(rows->whole)))
      return failure();
    Location loc = tile->getLoc();
    std::function<KernelInfo(OpBuilder &, const LaunchBody &)> emitCode;
    int64_t vectorWidth;
    if (auto forward = dyn_cast<ForwardIntoOp>(rows->whole)) {
      AttnResSpec spec = forwardSpec(forward);
      FailureOr<RowLayout> layout =
          choices.forwardLayout(forward, getArgument(), spec);
      if (failed(layout))
        return failure();
      SourceSchedule schedule = choices.forwardSchedule(spec, *layout);
      vectorWidth = layout->vectorWidth;
      emitCode = [&, spec, layout = *layout, schedule](OpBuilder &b,
                                                       const LaunchBody &body) {
        return emitForwardKernel(b, loc, kernel, spec, layout, schedule,
                                 ForwardKind::Whole, &body);
      };
    } else if (auto backward = dyn_cast<BackwardIntoOp>(rows->whole)) {
      AttnResSpec spec = backwardSpec(backward);
      FailureOr<RowLayout> layout =
          choices.backwardLayout(backward, getArgument(), spec);
      if (failed(layout))
        return failure();
      SourceSchedule schedule = choices.backwardSchedule(spec, *layout);
      vectorWidth = layout->vectorWidth;
      emitCode = [&, spec, layout = *layout, schedule](OpBuilder &b,
                                                       const LaunchBody &body) {
        return emitBackwardKernel(b, loc, kernel, spec, layout, schedule,
                                  &body);
      };
    } else {
      MergeSpec spec = mergeSpec(rows->whole, mergeLoadsInFlight);
      FailureOr<RowLayout> layout = choices.mergeLayout(
          rows->whole, getArgument(), spec.width, spec.output);
      if (failed(layout))
        return failure();
      vectorWidth = layout->vectorWidth;
      emitCode = [&, spec, layout = *layout](OpBuilder &b,
                                             const LaunchBody &body) {
        return emitMergeKernel(b, loc, kernel, spec, layout, &body);
      };
    }
    auto emit =
        [&](const llvm::StringMap<Value> &arguments) -> FailureOr<KernelInfo> {
      LaunchBody body{*launch, tile, arguments, rows->first, rows->count};
      OpBuilder b(tile);
      if (rows->tileRow)
        body.tileRow = arith::IndexCastOp::create(
            b, loc, b.getI64Type(),
            getValueOrCreateConstantIndexOp(b, loc, rows->tileRow));
      KernelInfo info = emitCode(b, body);
      if (info.workgroupBytes > kMaxWorkgroupBytes)
        return tile->emitError() << kPass << ": the tile's thread code needs "
                                 << info.workgroupBytes
                                 << " bytes of workgroup memory, more than the "
                                 << kMaxWorkgroupBytes << " a block may have";
      return info;
    };
    if (failed(launchTile(rows->whole, *launch, vectorWidth, kernel,
                          rows->equalSizes, emit, refusals)))
      return failure();
    tile->erase();
    // The views and sizes the tile's op alone used go with it.
    for (bool erased = true; erased;) {
      erased = false;
      for (Operation &op : llvm::make_early_inc_range(
               llvm::reverse(launch->getBody().front()))) {
        if (isOpTriviallyDead(&op)) {
          op.erase();
          erased = true;
        }
      }
    }
    return success();
  }
};

} // namespace
