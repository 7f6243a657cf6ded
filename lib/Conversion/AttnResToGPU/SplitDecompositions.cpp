//===- SplitDecompositions.cpp - the split passes' output on the grid -----===//
//
// Under keep-host, the decompositions of the split passes run as the
// kernels that implement them, on the grid the IR states.
//
// attnres-split-sources rewrites a forward over L sources into P forwards,
// partition p over sources [floor(p * L / P), floor((p + 1) * L / P)),
// each returning its FP32 output and lse, stacked and merged by a softmax
// partition_reduce. The split forward kernels are that decomposition: the
// blocks of row blockIdx.y = p (of the partial kernel, or of a cluster)
// walk the same sources, and the merge kernel (or the cluster) merges
// them. So the P forwards with their merge become the forward launched on
// P partitions.
//
// Nothing is taken on trust: the slices, the stacking, the partition
// boundaries and the insertions are checked against the rule above, and a
// decomposition that is not of this form is refused with the reason.
//
// attnres-split-reduction's loop over B blocks of tokens, and attnres-tile's
// loops, stay loops (attnres-lower-tiles-to-gpu makes them grids): here a
// loop that drops results of its op is given outputs for them back
// (completeTileLoops), and loops of another form than their op on slices
// are refused, naming what differs (checkTileLoops).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::attnres::gpu_kernels;

namespace {

/// What a matcher found to differ from the form it checks.
class FormMatcher {
public:
  std::string reason;

protected:
  LogicalResult fail(const Twine &why) {
    reason = why.str();
    return failure();
  }
};

/// Whether `size` is dimension `dim` of `tensor` (a tensor.dim of it).
bool isDimOf(OpFoldResult size, Value tensor, int64_t dim) {
  auto value = dyn_cast<Value>(size);
  auto read = value ? value.getDefiningOp<tensor::DimOp>() : tensor::DimOp();
  return read && read.getSource() == tensor &&
         isConstantIntValue(read.getDimension(), dim);
}

/// The P forwards whose FP32 outputs and lses a softmax partition_reduce
/// merges, as attnres-split-sources writes them.
class SplitForwardMatcher : public FormMatcher {
public:
  explicit SplitForwardMatcher(PartitionReduceOp merge) : merge(merge) {}

  /// Whether the merge's partials come from forwards at all (else it merges
  /// the caller's tensors and is launched as it is).
  bool mergesForwards();
  /// Checks the forwards; on success `partials` holds them and `sources`
  /// the whole forward's sources, else `reason` says what differs.
  LogicalResult check();

  SmallVector<ForwardOp> partials;
  SmallVector<Value> sources;
  /// The ops that stack the partial results, the sizes of the partial
  /// results they read, and the slices of packed sources the partials read
  /// (erased with them).
  SmallVector<Operation *> stacking, shapeReads, slices;

private:
  /// The values a stack along a new leading dimension is made of (a concat
  /// of unit-dimension expansions, or one expansion); empty if it is not
  /// such a stack.
  SmallVector<Value> unstack(Value stacked);

  PartitionReduceOp merge;
};

SmallVector<Value> SplitForwardMatcher::unstack(Value stacked) {
  auto concat = stacked.getDefiningOp<tensor::ConcatOp>();
  if (concat && (concat.getDim() != 0 || !concat->hasOneUse()))
    return {};
  SmallVector<Value> inputs;
  if (concat)
    llvm::append_range(inputs, concat.getInputs());
  else
    inputs.push_back(stacked);
  SmallVector<Value> pieces;
  for (Value input : inputs) {
    Value piece = stackedPiece(input);
    if (!piece || !input.hasOneUse())
      return {};
    pieces.push_back(piece);
    stacking.push_back(input.getDefiningOp());
  }
  if (concat)
    stacking.push_back(concat);
  return pieces;
}

bool SplitForwardMatcher::mergesForwards() {
  if (merge.getKind() != ReduceKind::Softmax)
    return false;
  SmallVector<Value> inputs{merge.getPartials()};
  if (auto concat = merge.getPartials().getDefiningOp<tensor::ConcatOp>())
    inputs.assign(concat.getInputs().begin(), concat.getInputs().end());
  // Every piece a forward's result; where one is not (a tile loop's, which
  // runs as that loop's grid: attnres-lower-tiles-to-gpu; the caller's
  // tensor) the pieces run one by one and the merge is launched on its
  // own.
  return llvm::all_of(inputs, [](Value input) {
    Value piece = stackedPiece(input);
    return piece && piece.getDefiningOp<ForwardOp>();
  });
}

LogicalResult SplitForwardMatcher::check() {
  if (merge.getSink() || !merge.getLse())
    return fail("the merge has a sink or no lse, unlike a forward");
  SmallVector<Value> outputs = unstack(merge.getPartials());
  SmallVector<Value> lses = unstack(merge.getPartialLse());
  if (outputs.empty() || outputs.size() != lses.size())
    return fail("the partial outputs and lses are not stacked forward "
                "results");
  for (auto [output, lse] : llvm::zip_equal(outputs, lses)) {
    auto partial = output.getDefiningOp<ForwardOp>();
    if (!partial || partial.getOutput() != output || partial.getLse() != lse)
      return fail("the partial outputs and lses are not those of the same "
                  "forwards, in order");
    // Besides its stacking, a result's shape may be read for the stacking.
    for (Value result : {output, lse}) {
      unsigned stacked = 0;
      for (Operation *user : result.getUsers()) {
        auto dim = dyn_cast<tensor::DimOp>(user);
        if (!dim) {
          ++stacked;
          continue;
        }
        if (!llvm::all_of(dim->getUsers(), [&](Operation *reader) {
              return llvm::is_contained(stacking, reader);
            }))
          return fail("a partial forward's shape is read besides its "
                      "stacking");
        shapeReads.push_back(dim);
      }
      if (stacked != 1)
        return fail("a partial forward's results are used besides the merge");
    }
    partials.push_back(partial);
  }
  ForwardOp first = partials.front();
  for (ForwardOp partial : partials) {
    if (partial.getOutputNormWeight() || partial.getSave() != SaveMode::Lse ||
        !getElementTypeOrSelf(partial.getOutput().getType()).isF32())
      return fail("a partial forward is not FP32 without an output norm, "
                  "saving lse");
    if (partial.getQuery() != first.getQuery() ||
        partial.getKeyNormWeight() != first.getKeyNormWeight() ||
        partial.getEpsAttr() != first.getEpsAttr() ||
        partial.getScaleAttr() != first.getScaleAttr() ||
        partial.getPacked() != first.getPacked() ||
        partial->getBlock() != merge->getBlock())
      return fail("the partial forwards differ in their query, weights, "
                  "attributes or block");
  }
  if (merge.getOutputNormWeight() && merge.getEpsAttr() != first.getEpsAttr())
    return fail("the merge's eps is not the forwards'");

  // The sources of each partition: its listed sources, or a slice of the
  // packed ones along L that keeps the other dimensions whole.
  SmallVector<int64_t> counts;
  Value packed;
  for (ForwardOp partial : partials) {
    if (!first.getPacked()) {
      llvm::append_range(sources, partial.getSources());
      counts.push_back(partial.getSources().size());
      continue;
    }
    auto slice =
        partial.getSources().front().getDefiningOp<tensor::ExtractSliceOp>();
    if (!slice)
      return fail("a partial forward's packed sources are not a slice");
    if (packed && slice.getSource() != packed)
      return fail("the partial forwards slice different packed sources");
    packed = slice.getSource();
    RankedTensorType whole = slice.getSourceType();
    if (slice.getResultType().getRank() != whole.getRank())
      return fail("a slice of the packed sources drops dimensions");
    if (whole.isDynamicDim(0))
      return fail("the packed sources have a dynamic source count");
    int64_t expectedBegin = 0;
    for (int64_t done : counts)
      expectedBegin += done;
    std::optional<int64_t> count =
        getConstantIntValue(slice.getMixedSizes()[0]);
    if (!isConstantIntValue(slice.getMixedOffsets()[0], expectedBegin) ||
        !count)
      return fail("the partitions are not consecutive slices of the packed "
                  "sources");
    for (int64_t dim = 0; dim < whole.getRank(); ++dim) {
      OpFoldResult size = slice.getMixedSizes()[dim];
      bool kept =
          dim == 0 || (isConstantIntValue(slice.getMixedOffsets()[dim], 0) &&
                       (whole.isDynamicDim(dim)
                            ? isDimOf(size, packed, dim)
                            : isConstantIntValue(size, whole.getDimSize(dim))));
      if (!kept || !isConstantIntValue(slice.getMixedStrides()[dim], 1))
        return fail("a slice of the packed sources does not keep dimension " +
                    Twine(dim) + " whole");
    }
    counts.push_back(*count);
    slices.push_back(slice);
  }
  int64_t L = 0;
  for (int64_t count : counts)
    L += count;
  if (packed) {
    if (L != cast<RankedTensorType>(packed.getType()).getDimSize(0))
      return fail("the partitions do not cover the packed sources");
    sources.push_back(packed);
  }
  // Partition p holds sources [floor(p * L / P), floor((p + 1) * L / P)).
  int64_t P = partials.size(), begin = 0;
  for (auto [p, count] : llvm::enumerate(counts)) {
    int64_t index = p;
    if (begin != index * L / P || begin + count != (index + 1) * L / P)
      return fail("partition " + Twine(index) + " holds sources [" +
                  Twine(begin) + ", " + Twine(begin + count) +
                  "), not [floor(p * L / P), floor((p + 1) * L / P))");
    begin += count;
  }
  return success();
}

/// The error for a decomposition that is not of `pass`'s form.
LogicalResult refuseForm(Operation *at, StringRef launched, StringRef pass,
                         const FormMatcher &matcher) {
  return at->emitError("convert-attnres-to-gpu: keep-host=1 launches ")
         << launched << ", which needs the form of " << pass << "; here "
         << matcher.reason;
}

/// Verifies the whole op built in place of `pass`'s decomposition (erased,
/// with an error at `at`, if it does not verify).
LogicalResult verifyWhole(Operation *whole, Operation *at, StringRef pass) {
  if (succeeded(mlir::verify(whole)))
    return success();
  whole->erase();
  return at->emitError("convert-attnres-to-gpu: the op over all of ")
         << pass << "'s pieces does not verify";
}

} // namespace

LogicalResult gpu_kernels::absorbSplitForwards(
    ModuleOp module, llvm::DenseMap<Operation *, int64_t> &partitions) {
  SmallVector<PartitionReduceOp> merges;
  module.walk([&](PartitionReduceOp op) { merges.push_back(op); });
  for (PartitionReduceOp merge : merges) {
    SplitForwardMatcher matcher(merge);
    if (!matcher.mergesForwards())
      continue;
    if (failed(matcher.check()))
      return refuseForm(merge,
                        "partial forwards and their merge as the "
                        "forward split over sources",
                        "attnres-split-sources", matcher);

    ForwardOp first = matcher.partials.front();

    // The forward over all sources, launched on P partitions.
    OpBuilder b(merge);
    auto typeOf = [](Value value) { return value ? value.getType() : Type(); };
    SaveMode save = merge.getOPreResidual() ? SaveMode::OPreResidual
                    : merge.getOPre()       ? SaveMode::OPre
                                            : SaveMode::Lse;
    auto whole = ForwardOp::create(
        b, merge.getLoc(), merge.getOutput().getType(),
        merge.getLse().getType(), typeOf(merge.getOPre()),
        typeOf(merge.getOPreResidual()), matcher.sources, first.getPackedAttr(),
        first.getQuery(), first.getKeyNormWeight(), merge.getOutputNormWeight(),
        first.getEpsAttr(), first.getScaleAttr(),
        SaveModeAttr::get(b.getContext(), save));
    if (failed(verifyWhole(whole, merge, "attnres-split-sources")))
      return failure();
    partitions[whole] = matcher.partials.size();
    merge->replaceAllUsesWith(whole);
    merge.erase();
    // Users before what they use: the stacks, the sizes they read, the
    // partials, their slices.
    for (Operation *op : llvm::reverse(matcher.stacking))
      op->erase();
    for (Operation *op : matcher.shapeReads)
      op->erase();
    for (ForwardOp partial : matcher.partials)
      partial.erase();
    for (Operation *slice : matcher.slices)
      if (slice->use_empty())
        slice->erase();
  }
  return success();
}

/// Erases what `loop`'s body computes and never uses (sizes the tiling
/// left behind, say): it would have no thread code to run in. An attnres
/// op stays (a loop that uses none of its results is an error, not a
/// loop to drop).
static void eraseUnusedInBody(scf::ForallOp loop) {
  SmallVector<Operation *> body;
  for (Operation &op : loop.getBody()->without_terminator())
    if (!isa_and_nonnull<AttnResDialect>(op.getDialect()))
      body.push_back(&op);
  for (Operation *op : llvm::reverse(body))
    if (isOpTriviallyDead(op))
      op->erase();
}

/// Gives `loop`, a tile loop around a forward or softmax merge `tile` that
/// writes some of the op's results (canonicalization drops a loop's unused
/// results), a shared output for each other result, written at its tile's
/// place. Every result of these ops is [M?, T..., rest] with the same
/// leading token dimensions as the first result and `rest` whole (D, D / 2
/// or nothing), so a dropped result's place is a written result's place on
/// the token dimensions and all of `rest`. Leaves a loop of another form
/// as it is (the checks that follow name what differs).
static void completeTileLoop(scf::ForallOp loop, Operation *tile) {
  unsigned numLoopResults = loop.getNumResults();
  SmallVector<tensor::ParallelInsertSliceOp> inserts;
  SmallVector<int> writer(tile->getNumResults(), -1);
  for (auto [index, op] :
       llvm::enumerate(loop.getTerminator().getYieldingOps())) {
    auto insert = dyn_cast<tensor::ParallelInsertSliceOp>(&op);
    auto result = insert ? dyn_cast<OpResult>(insert.getSource()) : OpResult();
    if (!result || result.getOwner() != tile || !result.hasOneUse() ||
        insert.getDest() != loop.getRegionIterArgs()[index] ||
        writer[result.getResultNumber()] >= 0)
      return;
    writer[result.getResultNumber()] = index;
    inserts.push_back(insert);
  }
  if (inserts.empty() || inserts.size() != numLoopResults ||
      inserts.size() == tile->getNumResults())
    return;
  // The written result whose place the others take their token
  // dimensions from, and those dimensions' count.
  tensor::ParallelInsertSliceOp model = inserts.front();
  int64_t tokenDims =
      cast<RankedTensorType>(tile->getResult(0).getType()).getRank() - 1;
  RankedTensorType wholeType = model.getDestType();
  Value wholeInit = loop.getOutputs()[0];
  if (wholeType.getRank() < tokenDims ||
      !llvm::all_of(model.getMixedStrides(), isOneInteger))
    return;
  for (int64_t dim = tokenDims; dim < wholeType.getRank(); ++dim)
    if (!isZeroInteger(model.getMixedOffsets()[dim]) ||
        wholeType.isDynamicDim(dim) ||
        !isConstantIntValue(model.getMixedSizes()[dim],
                            wholeType.getDimSize(dim)))
      return;
  SmallVector<unsigned> dropped;
  for (unsigned result = 0; result < tile->getNumResults(); ++result) {
    auto type = cast<RankedTensorType>(tile->getResult(result).getType());
    if (writer[result] >= 0)
      continue;
    // Hand-written IR may type a result's tokens apart from the written
    // one's (a dynamic against a static count): left to the checks.
    if (type.getRank() < tokenDims ||
        type.getShape().take_front(tokenDims) !=
            model.getSourceType().getShape().take_front(tokenDims) ||
        !llvm::all_of(type.getShape().drop_front(tokenDims),
                      ShapedType::isStatic))
      return;
    dropped.push_back(result);
  }

  OpBuilder b(loop);
  Location loc = loop.getLoc();
  SmallVector<Value> outputs(loop.getOutputs());
  for (unsigned result : dropped) {
    auto type = cast<RankedTensorType>(tile->getResult(result).getType());
    SmallVector<int64_t> shape(wholeType.getShape().take_front(tokenDims));
    llvm::append_range(shape, type.getShape().drop_front(tokenDims));
    SmallVector<Value> sizes;
    // The size the written output was made with, else read of it (a
    // tensor.empty's only users must be loops).
    for (int64_t dim = 0; dim < tokenDims; ++dim)
      if (wholeType.isDynamicDim(dim)) {
        Value size = madeWithSize(wholeInit, dim);
        sizes.push_back(size ? size
                             : tensor::DimOp::create(b, loc, wholeInit, dim));
      }
    outputs.push_back(tensor::EmptyOp::create(
        b, loc, RankedTensorType::get(shape, type.getElementType()), sizes));
  }
  auto grown = scf::ForallOp::create(
      b, loc, loop.getMixedLowerBound(), loop.getMixedUpperBound(),
      loop.getMixedStep(), outputs, loop.getMapping());
  Block *body = grown.getBody();
  body->getTerminator()->erase();
  SmallVector<Value> arguments(
      body->getArguments().take_front(loop.getBody()->getNumArguments()));
  IRRewriter rewriter(b);
  rewriter.mergeBlocks(loop.getBody(), body, arguments);
  b.setInsertionPointToEnd(grown.getTerminator().getBody());
  for (auto [index, result] : llvm::enumerate(dropped)) {
    auto type = cast<RankedTensorType>(tile->getResult(result).getType());
    SmallVector<OpFoldResult> offsets = model.getMixedOffsets();
    SmallVector<OpFoldResult> sizes = model.getMixedSizes();
    offsets.truncate(tokenDims);
    sizes.truncate(tokenDims);
    for (int64_t size : type.getShape().drop_front(tokenDims)) {
      offsets.push_back(b.getIndexAttr(0));
      sizes.push_back(b.getIndexAttr(size));
    }
    SmallVector<OpFoldResult> strides(type.getRank(), b.getIndexAttr(1));
    tensor::ParallelInsertSliceOp::create(
        b, loc, tile->getResult(result),
        grown.getRegionIterArgs()[numLoopResults + index], offsets, sizes,
        strides);
  }
  loop.replaceAllUsesWith(grown.getResults().take_front(numLoopResults));
  loop.erase();
}

void gpu_kernels::completeTileLoops(ModuleOp module) {
  // Each loop with its first tile op, and whether that op is its only one
  // (the erasure below keeps attnres ops).
  SmallVector<std::tuple<scf::ForallOp, Operation *, bool>> loops;
  module.walk([&](scf::ForallOp loop) {
    auto tiles = llvm::make_filter_range(
        loop.getBody()->without_terminator(),
        [](Operation &op) { return isLoweredTileOp(&op); });
    if (!tiles.empty())
      loops.emplace_back(loop, &*tiles.begin(), llvm::hasSingleElement(tiles));
  });
  for (auto [loop, tile, alone] : loops) {
    eraseUnusedInBody(loop);
    // One forward or merge: a backward's loop writes every result, and a
    // loop of several ops is refused as it is.
    if (alone && !isa<BackwardOp>(tile))
      completeTileLoop(loop, tile);
  }
}

LogicalResult gpu_kernels::checkTileLoops(ModuleOp module, bool keepHost) {
  SmallVector<std::pair<scf::ForallOp, Operation *>> loops;
  module.walk([&](Operation *op) {
    if (isa<ForwardOp, BackwardOp, PartitionReduceOp>(op))
      if (auto loop = dyn_cast<scf::ForallOp>(op->getParentOp()))
        loops.emplace_back(loop, op);
  });
  for (auto [loop, tile] : loops) {
    bool backward = isa<BackwardOp>(tile);
    // Without keep-host only a backward's loop is refused here; the other
    // loops are checked where keep-host lowers them.
    if (!keepHost && !backward)
      continue;
    if (!keepHost)
      return loop.emitError(
          "convert-attnres-to-gpu: a bundle's backward is launched whole by "
          "the runtime, which picks its blocks per call "
          "(AttnresBackwardArgs.blocks); attnres-split-reduction's loop runs "
          "on the GPU with keep-host=1");
    std::string mismatch;
    if (auto sum = dyn_cast<PartitionReduceOp>(tile);
        sum && sum.getKind() != ReduceKind::Softmax)
      mismatch = "the tiled op is a sum partition_reduce (its dimensions are "
                 "not tokens: it is launched whole)";
    else
      mismatch = tileLoopMismatch(loop);
    if (!mismatch.empty())
      return loop.emitError("convert-attnres-to-gpu: keep-host=1 runs a loop "
                            "around ")
             << (backward ? "a backward (attnres-split-reduction's)"
                          : "a forward or merge (attnres-tile's)")
             << " as a grid of its tiles; here " << mismatch;
  }
  return success();
}

ArrayAttr gpu_kernels::blockMapping(MLIRContext *context, int64_t rank,
                                    bool linear) {
  SmallVector<Attribute> dims;
  for (int64_t dim = 0; dim < rank; ++dim) {
    auto id = linear ? static_cast<gpu::MappingId>(
                           static_cast<int64_t>(gpu::MappingId::LinearDim0) +
                           rank - 1 - dim)
                     : static_cast<gpu::MappingId>(dim);
    dims.push_back(gpu::GPUBlockMappingAttr::get(context, id));
  }
  return ArrayAttr::get(context, dims);
}

bool gpu_kernels::hasRealizedMapping(scf::ForallOp loop, bool linear,
                                     std::string &reason) {
  std::optional<ArrayAttr> mapping = loop.getMapping();
  if (!mapping)
    return true;
  MLIRContext *context = loop.getContext();
  int64_t rank = loop.getRank();
  ArrayAttr wanted = blockMapping(context, rank, linear);
  if (*mapping == wanted ||
      (rank == 1 && *mapping == blockMapping(context, 1, !linear)))
    return true;
  llvm::raw_string_ostream os(reason);
  os << "the loop is mapped to " << *mapping << ", but its iterations run as "
     << "the blocks of one grid dimension: leave it unmapped or map it to "
     << wanted;
  return false;
}
