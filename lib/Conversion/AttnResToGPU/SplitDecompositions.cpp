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
// attnres-split-reduction's loop over B blocks of tokens, and attnres-tile's
// loops, stay loops where their body is their op on slices and nothing else
// (attnres-lower-tiles-to-gpu makes them grids); the loops of attnres-tile
// that drop a result of their op become blocks of its kernels here, and
// the split backward's loops of another form are refused.
//
// Nothing is taken on trust: the slices, the stacking, the partition
// boundaries and the insertions are checked against the rules above, and a
// decomposition that is not of this form is refused with the reason.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Affine/IR/AffineOps.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"
#include "mlir/IR/AffineExprVisitor.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "mlir/Transforms/RegionUtils.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"

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

/// `map` over `operands`, fully composed with the affine ops that define
/// them, each remaining operand renamed by `name` (a constant inline, else a
/// dimension or symbol among `numDims` / `numSymbols`); none where `name`
/// has no name for one.
std::optional<AffineMap>
composeRenamed(AffineMap map, SmallVector<Value> operands, unsigned numDims,
               unsigned numSymbols,
               function_ref<std::optional<AffineExpr>(Value)> name) {
  affine::fullyComposeAffineMapAndOperands(&map, &operands);
  affine::canonicalizeMapAndOperands(&map, &operands);
  SmallVector<AffineExpr> replacements;
  for (Value operand : operands) {
    std::optional<AffineExpr> renamed =
        getConstantIntValue(operand)
            ? getAffineConstantExpr(*getConstantIntValue(operand),
                                    map.getContext())
            : name(operand);
    if (!renamed)
      return std::nullopt;
    replacements.push_back(*renamed);
  }
  ArrayRef<AffineExpr> all(replacements);
  return map.replaceDimsAndSymbols(all.take_front(map.getNumDims()),
                                   all.drop_front(map.getNumDims()), numDims,
                                   numSymbols);
}

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

/// The ops a builder created, erased when this goes out of scope (users
/// first: in the reverse order of their creation).
struct ScratchOps : OpBuilder::Listener {
  SmallVector<Operation *> ops;
  void notifyOperationInserted(Operation *op, OpBuilder::InsertPoint) override {
    ops.push_back(op);
  }
  ~ScratchOps() override {
    for (Operation *op : llvm::reverse(ops))
      op->erase();
  }
};

/// An scf.forall of attnres-tile (over tokens by the tile size) or of
/// transform.structured.tile_using_forall (over tile numbers by 1): a
/// forward or softmax partition_reduce over each tile of its token
/// dimensions. The form is checked against the
/// op's own TilingInterface: the whole op's tile at the loop's indices must
/// have the loop's slices as operands, and its results must be inserted
/// where getResultTilePosition puts them. The kernels take tiles of
/// consecutive tokens (the token dimensions are one row index to them), so
/// the loop must tile the first r token dimensions, all but the last of them
/// by 1, and leave the others whole.
class TileLoopMatcher : public FormMatcher {
public:
  TileLoopMatcher(scf::ForallOp loop, Operation *tile)
      : loop(loop), tile(tile) {}

  /// Checks the loop; on success `whole` is the op over all tokens (built
  /// in front of the loop) and `tiles` the loop's shape; on failure `whole`
  /// is erased again and `reason` says what differs.
  LogicalResult check();

  Operation *whole = nullptr;
  TokenTiles tiles;
  /// The tiled op's result that each loop result is.
  SmallVector<unsigned> resultOf;

private:
  LogicalResult checkWithWhole();
  LogicalResult checkSize(OpFoldResult size, OpFoldResult count, unsigned dim);
  bool sameSize(OpFoldResult a, OpFoldResult b) const;
  std::optional<AffineMap> composedOver(Value value, unsigned dim,
                                        OpFoldResult count);
  bool isOffset(OpFoldResult offset, unsigned dim);
  bool isTileCount(OpFoldResult bound, OpFoldResult count, unsigned dim);
  /// The index expression of the first token of a tile of loop dimension
  /// `dim`: d0 by steps of the tile size, d0 * tile size normalized.
  AffineExpr offsetExpr(unsigned dim);

  /// Per loop dimension: the tile size, and whether the loop runs over tile
  /// numbers by 1 (transform.structured.tile_using_forall) rather than
  /// over tokens by the tile size (attnres-tile).
  SmallVector<int64_t> tileSize;
  SmallVector<bool> normalized;

  scf::ForallOp loop;
  Operation *tile;
  /// Each loop dimension's tile size, min(step, count - index), as the
  /// loop's body computes it.
  SmallVector<Value> tileSizes;
};

/// Whether two sizes are the same: equal constants, one value, or the same
/// dimension of one tensor.
bool TileLoopMatcher::sameSize(OpFoldResult a, OpFoldResult b) const {
  std::optional<int64_t> ca = getConstantIntValue(a);
  std::optional<int64_t> cb = getConstantIntValue(b);
  if (ca || cb)
    return ca == cb;
  auto va = cast<Value>(a), vb = cast<Value>(b);
  if (va == vb)
    return true;
  auto da = va.getDefiningOp<tensor::DimOp>();
  auto db = vb.getDefiningOp<tensor::DimOp>();
  return da && db && da.getSource() == db.getSource() &&
         getConstantIntValue(da.getDimension()) ==
             getConstantIntValue(db.getDimension());
}

AffineExpr TileLoopMatcher::offsetExpr(unsigned dim) {
  AffineExpr index = getAffineDimExpr(0, loop.getContext());
  return normalized[dim] ? index * tileSize[dim] : index;
}

/// The affine map `value` computes (an affine.min or affine.apply, fully
/// composed, or the value itself), renamed to d0 = the index of loop
/// dimension `dim` and s0 = `count`; none where it reads anything else.
std::optional<AffineMap>
TileLoopMatcher::composedOver(Value value, unsigned dim, OpFoldResult count) {
  MLIRContext *context = loop.getContext();
  AffineMap map = AffineMap::get(1, 0, getAffineDimExpr(0, context));
  SmallVector<Value> operands = {value};
  if (auto min = value.getDefiningOp<affine::AffineMinOp>()) {
    map = min.getAffineMap();
    operands.assign(min.getOperands().begin(), min.getOperands().end());
  } else if (auto apply = value.getDefiningOp<affine::AffineApplyOp>()) {
    map = apply.getAffineMap();
    operands.assign(apply.getOperands().begin(), apply.getOperands().end());
  }
  return composeRenamed(map, operands, 1, 1,
                        [&](Value operand) -> std::optional<AffineExpr> {
                          if (operand == loop.getInductionVar(dim))
                            return getAffineDimExpr(0, context);
                          if (count && sameSize(operand, count))
                            return getAffineSymbolExpr(0, context);
                          return std::nullopt;
                        });
}

/// Whether `offset` is the first token of the tile of loop dimension `dim`.
bool TileLoopMatcher::isOffset(OpFoldResult offset, unsigned dim) {
  auto value = dyn_cast<Value>(offset);
  if (!value)
    return false;
  std::optional<AffineMap> map = composedOver(value, dim, OpFoldResult());
  return map && map->getNumResults() == 1 &&
         simplifyAffineExpr(map->getResult(0), 1, 1) == offsetExpr(dim);
}

/// Whether `bound` is the loop's count over `count` tokens: `count` by
/// steps of the tile size, ceil(count / tile size) normalized.
bool TileLoopMatcher::isTileCount(OpFoldResult bound, OpFoldResult count,
                                  unsigned dim) {
  if (!normalized[dim])
    return sameSize(bound, count);
  int64_t size = tileSize[dim];
  if (std::optional<int64_t> tokens = getConstantIntValue(count))
    return isConstantIntValue(bound, llvm::divideCeil(*tokens, size));
  auto value = dyn_cast<Value>(bound);
  if (!value || !value.getDefiningOp<affine::AffineApplyOp>())
    return false;
  std::optional<AffineMap> map = composedOver(value, dim, count);
  return map && map->getNumResults() == 1 &&
         simplifyAffineExpr(map->getResult(0), 1, 1) ==
             getAffineSymbolExpr(0, loop.getContext()).ceilDiv(size);
}

/// Whether `size` is min(step, count - index) of loop dimension `dim`: an
/// affine.min (fully composed), or the step itself where it is 1 or divides
/// a static count.
LogicalResult TileLoopMatcher::checkSize(OpFoldResult size, OpFoldResult count,
                                         unsigned dim) {
  int64_t step = tileSize[dim];
  std::optional<int64_t> staticCount = getConstantIntValue(count);
  if (std::optional<int64_t> constant = getConstantIntValue(size))
    return success(*constant == step &&
                   (step == 1 || (staticCount && *staticCount % step == 0)));
  if (!cast<Value>(size).getDefiningOp<affine::AffineMinOp>())
    return failure();
  std::optional<AffineMap> renamed =
      composedOver(cast<Value>(size), dim, count);
  if (!renamed)
    return failure();
  MLIRContext *context = loop.getContext();
  AffineExpr N = staticCount ? getAffineConstantExpr(*staticCount, context)
                             : getAffineSymbolExpr(0, context);
  SmallVector<AffineExpr> wanted = {
      getAffineConstantExpr(step, context),
      simplifyAffineExpr(N - offsetExpr(dim), 1, 1)};
  SmallVector<AffineExpr> found;
  for (AffineExpr result : renamed->getResults())
    found.push_back(simplifyAffineExpr(result, 1, 1));
  return success(found.size() == wanted.size() &&
                 llvm::all_of(wanted, [&](AffineExpr expr) {
                   return llvm::is_contained(found, expr);
                 }));
}

LogicalResult TileLoopMatcher::check() {
  int64_t rank = loop.getRank();
  if (std::string mapped; !hasRealizedMapping(loop, /*linear=*/true, mapped))
    return fail(mapped);
  for (int64_t dim = 0; dim < rank; ++dim) {
    std::optional<int64_t> step = getConstantIntValue(loop.getMixedStep()[dim]);
    if (!isConstantIntValue(loop.getMixedLowerBound()[dim], 0) || !step ||
        *step < 1)
      return fail("the loop does not run from 0 by a constant step");
    // Over tile numbers by 1, the body scales the index by the tile size
    // to find the tile's first token.
    int64_t size = *step;
    bool scaled = false;
    Value index = loop.getInductionVar(dim);
    AffineExpr d0 = getAffineDimExpr(0, loop.getContext());
    for (Operation *user : index.getUsers()) {
      auto apply = dyn_cast<affine::AffineApplyOp>(user);
      if (*step != 1 || !apply || apply.getMapOperands() != ValueRange{index})
        continue;
      AffineExpr result =
          simplifyAffineExpr(apply.getAffineMap().getResult(0), 1, 0);
      auto product = dyn_cast<AffineBinaryOpExpr>(result);
      auto scale = product ? dyn_cast<AffineConstantExpr>(product.getRHS())
                           : AffineConstantExpr();
      if (!scale || product.getKind() != AffineExprKind::Mul ||
          product.getLHS() != d0 || scale.getValue() < 2)
        continue;
      if (scaled && scale.getValue() != size)
        return fail("loop dimension " + Twine(dim) +
                    " is scaled by two tile sizes");
      size = scale.getValue();
      scaled = true;
    }
    if (dim + 1 < rank && size != 1)
      return fail("token dimension " + Twine(dim) + " is tiled by " +
                  Twine(size) +
                  ": a tile is consecutive tokens only where every tiled "
                  "dimension but the last is tiled by 1");
    tileSize.push_back(size);
    normalized.push_back(scaled);
  }
  tiles.dims = rank;
  tiles.tokens = tileSize.back();
  if (auto reduce = dyn_cast<PartitionReduceOp>(tile);
      reduce && reduce.getKind() != ReduceKind::Softmax)
    return fail("the tiled op is a sum partition_reduce (its kernel has no "
                "token tiles)");
  for (Operation &op : loop.getBody()->without_terminator())
    if (&op != tile && (isa<ForwardOp, BackwardOp, PartitionReduceOp>(op) ||
                        op.getNumRegions() != 0 || !isMemoryEffectFree(&op)))
      return fail("the loop's body does more than one attnres op ('" +
                  op.getName().getStringRef() + "')");

  // The op over all tokens: each operand the tensor its slice was taken
  // from, or the operand itself where it is shared by all tiles.
  SmallVector<Value> operands;
  for (Value operand : tile->getOperands()) {
    if (loop.isDefinedOutsideOfLoop(operand)) {
      operands.push_back(operand);
      continue;
    }
    auto slice = operand.getDefiningOp<tensor::ExtractSliceOp>();
    if (!slice || !loop.isDefinedOutsideOfLoop(slice.getSource()))
      return fail("an operand of the tiled op is not a slice of a tensor "
                  "defined outside the loop");
    operands.push_back(slice.getSource());
  }
  // Each loop result is a result of the tiled op inserted at its tile;
  // results nobody uses may have been dropped (canonicalization drops the
  // loop's unused results).
  scf::InParallelOp terminator = loop.getTerminator();
  if (llvm::range_size(terminator.getYieldingOps()) != loop.getNumResults())
    return fail("a shared output of the loop is not written");
  for (auto [index, op] : llvm::enumerate(terminator.getYieldingOps())) {
    auto insert = dyn_cast<tensor::ParallelInsertSliceOp>(&op);
    auto result = insert ? dyn_cast<OpResult>(insert.getSource()) : OpResult();
    if (!result || result.getOwner() != tile ||
        insert.getDest() != loop.getRegionIterArgs()[index] ||
        llvm::is_contained(resultOf, result.getResultNumber()))
      return fail("the loop's results are not the tiled op's");
    resultOf.push_back(result.getResultNumber());
  }

  // The op over all tokens, its results typed as the loop's; a result the
  // loop dropped is typed from the op's own tile position of all tokens.
  OpBuilder b(loop);
  SmallVector<Type> types(tile->getResultTypes());
  for (auto [index, result] : llvm::enumerate(resultOf))
    types[result] = loop.getResult(index).getType();
  whole = mlir::clone(b, tile, types, operands);
  if (resultOf.size() != tile->getNumResults()) {
    ScratchOps built;
    OpBuilder scratch(loop.getContext(), &built);
    scratch.setInsertionPoint(whole);
    auto interface = cast<TilingInterface>(whole);
    SmallVector<OpFoldResult> offsets, sizes;
    for (Range range : interface.getIterationDomain(scratch)) {
      offsets.push_back(range.offset);
      sizes.push_back(range.size);
    }
    for (unsigned result = 0; result < types.size(); ++result) {
      if (llvm::is_contained(resultOf, result))
        continue;
      SmallVector<OpFoldResult> resultOffsets, resultSizes;
      if (failed(interface.getResultTilePosition(
              scratch, result, offsets, sizes, resultOffsets, resultSizes))) {
        whole->erase();
        whole = nullptr;
        return fail("the op's TilingInterface gives no position of result " +
                    Twine(result));
      }
      auto shape = llvm::map_to_vector(resultSizes, [](OpFoldResult size) {
        return getConstantIntValue(size).value_or(ShapedType::kDynamic);
      });
      types[result] = RankedTensorType::get(
          shape, cast<ShapedType>(types[result]).getElementType());
    }
    Operation *typed = mlir::clone(b, tile, types, operands);
    whole->erase();
    whole = typed;
  }
  if (succeeded(checkWithWhole()))
    return success();
  whole->erase();
  whole = nullptr;
  return failure();
}

LogicalResult TileLoopMatcher::checkWithWhole() {
  if (failed(mlir::verify(whole)))
    return fail("the op over all tokens does not verify");
  auto interface = cast<TilingInterface>(whole);
  // Everything built here to compare with is erased again.
  ScratchOps built;
  OpBuilder b(loop.getContext(), &built);
  b.setInsertionPoint(loop);
  SmallVector<Range> domain = interface.getIterationDomain(b);
  unsigned rank = loop.getRank();
  if (domain.size() < rank)
    return fail("the loop has more dimensions than the op has tokens");
  for (unsigned dim = 0; dim < rank; ++dim)
    if (!isTileCount(loop.getMixedUpperBound()[dim], domain[dim].size, dim))
      return fail("loop dimension " + Twine(dim) +
                  " does not run over token dimension " + Twine(dim) +
                  " (a tile takes the first token dimensions, all but the "
                  "last by 1, and the others whole)");

  // The tile the interface builds at the loop's indices, each loop
  // dimension's size a placeholder (a value of its own, not a constant)
  // that stands for its tile size, compared with the loop's body.
  b.setInsertionPointToStart(loop.getBody());
  SmallVector<OpFoldResult> offsets, sizes;
  SmallVector<Value> offsetPlaceholders, placeholders;
  for (unsigned dim = 0; dim < domain.size(); ++dim) {
    if (dim >= rank) {
      offsets.push_back(domain[dim].offset);
      sizes.push_back(domain[dim].size);
      continue;
    }
    Value index = loop.getInductionVar(dim);
    offsetPlaceholders.push_back(
        arith::SubIOp::create(b, loop.getLoc(), index, index));
    placeholders.push_back(
        arith::AddIOp::create(b, loop.getLoc(), index, index));
    offsets.push_back(offsetPlaceholders.back());
    sizes.push_back(placeholders.back());
  }
  tileSizes.assign(rank, Value());
  FailureOr<TilingResult> expected =
      interface.getTiledImplementation(b, offsets, sizes);
  if (failed(expected) || expected->tiledOps.size() != 1)
    return fail("the op's TilingInterface gives no tile");
  Operation *expectedTile = expected->tiledOps.front();
  auto sameAt = [&](OpFoldResult found, OpFoldResult wanted) {
    if (auto value = dyn_cast<Value>(wanted)) {
      if (auto *at = llvm::find(placeholders, value);
          at != placeholders.end()) {
        unsigned dim = at - placeholders.begin();
        // A constant size is checked each time; a value once, then held.
        if (getConstantIntValue(found))
          return succeeded(checkSize(found, domain[dim].size, dim));
        auto size = cast<Value>(found);
        if (!tileSizes[dim] &&
            succeeded(checkSize(size, domain[dim].size, dim)))
          tileSizes[dim] = size;
        return size == tileSizes[dim];
      }
      if (auto *at = llvm::find(offsetPlaceholders, value);
          at != offsetPlaceholders.end())
        return isOffset(found, at - offsetPlaceholders.begin());
    }
    return sameSize(found, wanted);
  };
  auto samePosition = [&](ArrayRef<OpFoldResult> foundOffsets,
                          ArrayRef<OpFoldResult> foundSizes,
                          ArrayRef<OpFoldResult> foundStrides,
                          ArrayRef<OpFoldResult> wantedOffsets,
                          ArrayRef<OpFoldResult> wantedSizes) {
    if (foundOffsets.size() != wantedOffsets.size() ||
        !llvm::all_of(foundStrides,
                      [](OpFoldResult s) { return isConstantIntValue(s, 1); }))
      return false;
    for (auto [found, wanted] : llvm::zip_equal(foundOffsets, wantedOffsets))
      if (!sameAt(found, wanted))
        return false;
    for (auto [found, wanted] : llvm::zip_equal(foundSizes, wantedSizes))
      if (!sameAt(found, wanted))
        return false;
    return true;
  };
  for (auto [index, pair] : llvm::enumerate(
           llvm::zip_equal(tile->getOperands(), expectedTile->getOperands()))) {
    auto [found, wanted] = pair;
    auto wantedSlice = wanted.getDefiningOp<tensor::ExtractSliceOp>();
    if (!wantedSlice ||
        !llvm::is_contained(expected->generatedSlices, wantedSlice)) {
      if (found != wanted)
        return fail("operand " + Twine(index) +
                    " of the tiled op is sliced, not shared by all tiles");
      continue;
    }
    auto slice = found.getDefiningOp<tensor::ExtractSliceOp>();
    if (!slice || slice.getSource() != wantedSlice.getSource() ||
        !samePosition(slice.getMixedOffsets(), slice.getMixedSizes(),
                      slice.getMixedStrides(), wantedSlice.getMixedOffsets(),
                      wantedSlice.getMixedSizes()))
      return fail("operand " + Twine(index) +
                  " of the tiled op is not the slice of the loop's tile "
                  "(tokens [t, t + min(step, N - t)) of each tiled "
                  "dimension, the others whole)");
  }

  scf::InParallelOp terminator = loop.getTerminator();
  for (Operation &op : terminator.getYieldingOps()) {
    auto insert = cast<tensor::ParallelInsertSliceOp>(&op);
    unsigned result = cast<OpResult>(insert.getSource()).getResultNumber();
    SmallVector<OpFoldResult> resultOffsets, resultSizes;
    if (failed(interface.getResultTilePosition(b, result, offsets, sizes,
                                               resultOffsets, resultSizes)) ||
        !samePosition(insert.getMixedOffsets(), insert.getMixedSizes(),
                      insert.getMixedStrides(), resultOffsets, resultSizes))
      return fail("result " + Twine(result) +
                  " of the tiled op is not inserted at its tile");
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
    ModuleOp module, llvm::DenseMap<Operation *, int64_t> &partitions,
    llvm::DenseMap<Operation *, TokenTiles> &tileTokens,
    llvm::DenseMap<Operation *, TokenTiles> &mergeTileTokens) {
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

    // The partial forward kernel's blocks take the partials' tiles (one size
    // for all: they are one kernel), the merge kernel's the merge's.
    ForwardOp first = matcher.partials.front();
    TokenTiles partialTile = tileTokens.lookup(first);
    for (ForwardOp partial : matcher.partials)
      if (tileTokens.lookup(partial) != partialTile)
        return merge.emitError("convert-attnres-to-gpu: keep-host=1 launches "
                               "the partial forwards as one kernel, whose "
                               "blocks take one tile; here the partials are "
                               "tiled differently");

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
    if (partialTile)
      tileTokens[whole] = partialTile;
    mergeTileTokens[whole] = tileTokens.lookup(merge);
    tileTokens.erase(merge);
    merge->replaceAllUsesWith(whole);
    merge.erase();
    // Users before what they use: the stacks, the sizes they read, the
    // partials, their slices.
    for (Operation *op : llvm::reverse(matcher.stacking))
      op->erase();
    for (Operation *op : matcher.shapeReads)
      op->erase();
    for (ForwardOp partial : matcher.partials) {
      tileTokens.erase(partial);
      partial.erase();
    }
    for (Operation *slice : matcher.slices)
      if (slice->use_empty())
        slice->erase();
  }
  return success();
}

LogicalResult gpu_kernels::checkSplitBackwards(ModuleOp module, bool keepHost) {
  SmallVector<scf::ForallOp> loops;
  module.walk([&](BackwardOp op) {
    if (auto loop = dyn_cast<scf::ForallOp>(op->getParentOp()))
      loops.push_back(loop);
  });
  if (!keepHost && !loops.empty())
    return loops.front().emitError(
        "convert-attnres-to-gpu: a bundle's backward is launched whole by "
        "the runtime, which picks its blocks per call "
        "(AttnresBackwardArgs.blocks); attnres-split-reduction's loop runs on "
        "the GPU with keep-host=1");
  for (scf::ForallOp loop : loops) {
    // What the body computes and never uses (sizes the tiling left behind,
    // say) would have no thread code to run in.
    SmallVector<Operation *> body;
    for (Operation &op : loop.getBody()->without_terminator())
      body.push_back(&op);
    for (Operation *op : llvm::reverse(body))
      if (isOpTriviallyDead(op))
        op->erase();
    std::string mismatch = tileLoopMismatch(loop);
    if (!mismatch.empty())
      return loop.emitError("convert-attnres-to-gpu: keep-host=1 runs a "
                            "loop around a backward (attnres-split-"
                            "reduction's) as a grid of its tiles; here ")
             << mismatch;
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

LogicalResult gpu_kernels::absorbTileLoops(
    ModuleOp module, llvm::DenseMap<Operation *, TokenTiles> &tileTokens) {
  SmallVector<std::pair<scf::ForallOp, Operation *>> loops;
  module.walk([&](Operation *op) {
    if (!isa<ForwardOp, PartitionReduceOp>(op))
      return;
    auto loop = dyn_cast<scf::ForallOp>(op->getParentOp());
    // A forward's or merge's own tile loop runs as a grid of its own
    // (attnres-lower-tiles-to-gpu), a split forward's partials and merge
    // too; the others (a loop that drops one of its op's results, say) run
    // as blocks of the op's kernels.
    if (loop && isLoweredTileLoop(loop))
      return;
    if (loop)
      loops.emplace_back(loop, op);
  });
  for (auto [loop, tile] : loops) {
    TileLoopMatcher matcher(loop, tile);
    if (failed(matcher.check()))
      return refuseForm(loop,
                        "an scf.forall around a forward or merge as blocks "
                        "of its kernels that each take one tile of tokens",
                        "attnres-tile", matcher);
    tileTokens[matcher.whole] = matcher.tiles;
    for (auto [index, result] : llvm::enumerate(matcher.resultOf))
      loop.getResult(index).replaceAllUsesWith(
          matcher.whole->getResult(result));
    // What the loop alone used goes with it (its bound, its empty outputs
    // and the sizes they read, the sizes its body read of what it slices),
    // so that no value is kept alive by a size read of it: a split
    // forward's stacked partials must have the merge as their one user.
    llvm::SetVector<Operation *> candidates;
    SmallVector<Value> used(loop->getOperands());
    llvm::SetVector<Value> captured;
    getUsedValuesDefinedAbove(loop.getRegion(), captured);
    llvm::append_range(used, captured);
    for (Value operand : used)
      if (Operation *producer = operand.getDefiningOp())
        candidates.insert(producer);
    loop.erase();
    auto dead = [](Operation *op) { return isOpTriviallyDead(op); };
    // An op leaves the set when it is erased, so none is visited twice.
    while (Operation *op = [&]() -> Operation * {
      auto found = llvm::find_if(candidates, dead);
      return found == candidates.end() ? nullptr : *found;
    }()) {
      candidates.remove(op);
      for (Value operand : op->getOperands())
        if (Operation *producer = operand.getDefiningOp())
          candidates.insert(producer);
      op->erase();
    }
  }
  return success();
}
