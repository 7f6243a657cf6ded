//===- HostBufferize.cpp - the kept host functions into device memory -----===//
//
// attnres-bufferize-host: upstream one-shot bufferization of the functions
// convert-attnres-to-gpu keeps (keep-host), with every buffer in device
// memory. The attnres ops bufferize into their ops on buffers (their
// BufferizableOpInterface), which attnres-launch-kernels launches.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"
#include "attnres/Dialect/AttnRes/Transforms/BufferizableOpInterfaceImpl.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Transforms/FuncBufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotModuleBufferize.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"

#include <numeric>

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESBUFFERIZEHOST
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;

namespace {

/// The buffer `value` is a view of, through any view-like ops.
Value bufferOf(Value value) {
  while (auto view = value.getDefiningOp<ViewLikeOpInterface>())
    value = view.getViewSource();
  return value;
}

/// The position of the first of an op on buffers' outs (its last operand
/// segment).
unsigned firstOutOf(Operation *op) {
  return op->getNumOperands() -
         op->getAttrOfType<DenseI32ArrayAttr>("operandSegmentSizes")
             .asArrayRef()
             .back();
}

/// The source and target of a copy (gpu.memcpy without a token, or
/// memref.copy); nulls for any other op.
std::pair<Value, Value> copyEnds(Operation *op) {
  if (auto memcpy = dyn_cast<gpu::MemcpyOp>(op))
    return memcpy.getAsyncToken() ? std::pair<Value, Value>()
                                  : std::pair(memcpy.getSrc(), memcpy.getDst());
  if (auto copy = dyn_cast<memref::CopyOp>(op))
    return {copy.getSource(), copy.getTarget()};
  return {};
}

/// The view a fresh buffer `out` of `op` is copied into and nothing else,
/// where `op` may write into that view instead: the copy follows `op` in
/// its block with only views and other copies of `op`'s outs between, and
/// the view's buffer is none that `op` reads or writes otherwise.
/// Bufferization gives an op on tensors a new buffer for each result, so a
/// tile loop's op would write its tile there and copy it into the loop's
/// output.
Operation *copyIntoView(Operation *op, Value out) {
  Operation *alloc = out.getDefiningOp();
  if (!alloc || !(isa<memref::AllocOp>(alloc) ||
                  (isa<gpu::AllocOp>(alloc) &&
                   !cast<gpu::AllocOp>(alloc).getAsyncToken())))
    return nullptr;
  Operation *copy = nullptr;
  for (Operation *user : out.getUsers()) {
    if (user == op || isa<memref::DeallocOp>(user))
      continue;
    if (auto dealloc = dyn_cast<gpu::DeallocOp>(user)) {
      if (dealloc.getAsyncToken())
        return nullptr;
      continue;
    }
    if (copyEnds(user).first != out || copy)
      return nullptr;
    copy = user;
  }
  if (!copy || copy->getBlock() != op->getBlock() ||
      !op->isBeforeInBlock(copy) || llvm::count(op->getOperands(), out) != 1)
    return nullptr;
  ValueRange outs = op->getOperands().drop_front(firstOutOf(op));
  Value view = copyEnds(copy).second;
  if (!mlir::attnres::hasContiguousRows(cast<MemRefType>(view.getType())))
    return nullptr;
  // Between the op and the copy only views and the copies of the op's other
  // results into other buffers: the view holds what it held when the op ran.
  Value buffer = bufferOf(view);
  for (Operation *between = op->getNextNode(); between != copy;
       between = between->getNextNode()) {
    if (isa<memref::SubViewOp>(between))
      continue;
    auto [from, to] = copyEnds(between);
    if (!from || !llvm::is_contained(outs, from) || bufferOf(to) == buffer)
      return nullptr;
  }
  // The view's buffer must exist before the op and be none of its others.
  for (Value operand : op->getOperands())
    if (operand != out && bufferOf(operand) == buffer)
      return nullptr;
  // The subviews that make the view move up to the op.
  auto root = [](Value value) {
    while (auto subview = value.getDefiningOp<memref::SubViewOp>())
      value = subview.getSource();
    return value;
  };
  Value viewed = root(view);
  for (Value producer = view; producer != viewed;
       producer = producer.getDefiningOp<memref::SubViewOp>().getSource()) {
    Operation *subview = producer.getDefiningOp();
    if (subview->getBlock() == op->getBlock() && op->isBeforeInBlock(subview))
      for (Value operand : subview->getOperands())
        if (Operation *definition = operand.getDefiningOp();
            definition && definition->getBlock() == op->getBlock() &&
            !definition->isBeforeInBlock(op) &&
            !isa<memref::SubViewOp>(definition))
          return nullptr;
  }
  if (Operation *definition = viewed.getDefiningOp();
      definition && definition->getBlock() == op->getBlock() &&
      !definition->isBeforeInBlock(op))
    return nullptr;
  return copy;
}

/// Lets each op on buffers write its results where bufferization copies
/// them (copyIntoView): the view takes the new buffer's place in `outs`,
/// and the buffer and the copy go.
void writeOutsInPlace(ModuleOp module) {
  SmallVector<Operation *> ops;
  module.walk([&](Operation *op) {
    if (mlir::attnres::isOpOnBuffers(op))
      ops.push_back(op);
  });
  for (Operation *op : ops) {
    unsigned firstOut = firstOutOf(op);
    for (unsigned index = firstOut; index < op->getNumOperands(); ++index) {
      Value out = op->getOperand(index);
      Operation *copy = copyIntoView(op, out);
      if (!copy)
        continue;
      Value view = copyEnds(copy).second;
      // The view's subviews move up to the op (their operands precede it).
      SmallVector<Operation *> chain;
      for (Value value = view;
           auto subview = value.getDefiningOp<memref::SubViewOp>();
           value = subview.getSource())
        if (subview->getBlock() == op->getBlock() &&
            op->isBeforeInBlock(subview))
          chain.push_back(subview);
      for (Operation *subview : llvm::reverse(chain))
        subview->moveBefore(op);
      op->setOperand(index, view);
      copy->erase();
      Operation *alloc = out.getDefiningOp();
      for (Operation *user : llvm::make_early_inc_range(out.getUsers()))
        user->erase();
      alloc->erase();
    }
  }
}

/// Whether `a` and `b` are the same elements of one buffer: the same value,
/// or equal views of the same one (during bufferization, a tensor's buffer
/// may be read by several bufferization.to_buffer ops).
bool isSameView(Value a, Value b) {
  if (a == b)
    return true;
  auto bufferA = a.getDefiningOp<bufferization::ToBufferOp>();
  auto bufferB = b.getDefiningOp<bufferization::ToBufferOp>();
  if (bufferA && bufferB)
    return bufferA.getTensor() == bufferB.getTensor() &&
           a.getType() == b.getType();
  auto x = a.getDefiningOp<memref::SubViewOp>();
  auto y = b.getDefiningOp<memref::SubViewOp>();
  return x && y && x.getType() == y.getType() &&
         isSameView(x.getSource(), y.getSource()) &&
         x.isSameAs(y, isEqualConstantIntOrValue);
}

/// The output of a tile loop that `piece` (one of its results) is written
/// into, where it is a tensor.empty (which CSE may have made one for
/// several loops), or null.
OpOperand *emptyOutputOf(Value piece) {
  auto loop = piece.getDefiningOp<scf::ForallOp>();
  if (!loop)
    return nullptr;
  OpOperand *output = loop.getTiedOpOperand(cast<OpResult>(piece));
  return output->get().getDefiningOp<tensor::EmptyOp>() ? output : nullptr;
}

/// A stack of pieces (attnres-split-sources' partial outputs or lses,
/// stacked for the merge) as one tensor the pieces are inserted into, each
/// right after it is made, and that a tile loop making a piece writes
/// directly: its output becomes its slice of the stack, so that one-shot
/// bufferization makes it a view of the stack's buffer. Left a
/// tensor.concat, bufferization would give every piece a buffer of its own
/// and copy them all. A piece that no tile loop makes is copied into the
/// stack, a copy writeOutsInPlace removes where the piece's op can write
/// the stack itself (a copy that remains is refused: refuseViewCopies).
void stackInPlace(tensor::ConcatOp concat) {
  SmallVector<Value> pieces = stackedPieces(concat);
  if (pieces.empty())
    return;
  Block *block = concat->getBlock();
  auto producerOf = [&](Value piece) -> Operation * {
    Operation *producer = piece.getDefiningOp();
    return producer && producer->getBlock() == block ? producer : nullptr;
  };
  // Pieces made in the block, in the order they are made; the others (its
  // arguments, values from outside) before them.
  SmallVector<unsigned> order(pieces.size());
  std::iota(order.begin(), order.end(), 0);
  for (Value piece : pieces)
    if (Operation *producer = producerOf(piece);
        producer && !producer->isBeforeInBlock(concat))
      return;
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    Operation *x = producerOf(pieces[a]), *y = producerOf(pieces[b]);
    return y && (!x || x->isBeforeInBlock(y));
  });

  auto stackType = cast<RankedTensorType>(concat.getType());
  // The stack is made before the first piece, sized as it is (a loop's
  // piece as its empty output, made before the loop).
  IRRewriter rewriter(concat.getContext());
  Location loc = concat.getLoc();
  Value first = pieces[order.front()];
  SmallVector<OpFoldResult> pieceSizes;
  if (OpOperand *output = emptyOutputOf(first)) {
    auto empty = output->get().getDefiningOp<tensor::EmptyOp>();
    pieceSizes = empty.getMixedSizes();
    rewriter.setInsertionPoint(empty);
  } else if (Operation *producer = producerOf(first)) {
    // Before the op, where its result's sizes can be told (so that it may
    // write its piece of the stack in place: writeOutsInPlace), else after.
    ReifiedRankedShapedTypeDims shapes;
    rewriter.setInsertionPoint(producer);
    if (succeeded(reifyResultShapes(rewriter, producer, shapes)))
      pieceSizes = shapes[cast<OpResult>(first).getResultNumber()];
    else
      rewriter.setInsertionPointAfter(producer);
  } else {
    rewriter.setInsertionPointToStart(block);
    if (Operation *definition = first.getDefiningOp();
        definition && definition->getBlock() == block)
      rewriter.setInsertionPointAfter(definition);
  }
  if (pieceSizes.empty())
    pieceSizes = tensor::getMixedSizes(rewriter, loc, first);
  // The stack's type is the concat's: where it states a size, that one.
  SmallVector<OpFoldResult> sliceSizes{rewriter.getIndexAttr(1)};
  for (auto [dim, size] : llvm::enumerate(pieceSizes))
    sliceSizes.push_back(
        stackType.isDynamicDim(dim + 1)
            ? OpFoldResult(getValueOrCreateConstantIndexOp(rewriter, loc, size))
            : rewriter.getIndexAttr(stackType.getDimSize(dim + 1)));
  auto sliceType = RankedTensorType::get(stackType.getShape().drop_front(),
                                         stackType.getElementType());
  SmallVector<OpFoldResult> stackSizes(sliceSizes);
  stackSizes.front() = rewriter.getIndexAttr(pieces.size());
  Value stack = tensor::EmptyOp::create(rewriter, loc, stackSizes,
                                        stackType.getElementType())
                    .getResult();
  SmallVector<OpFoldResult> strides(stackType.getRank(),
                                    rewriter.getIndexAttr(1));
  auto offsetsOf = [&](unsigned index) {
    SmallVector<OpFoldResult> offsets(stackType.getRank(),
                                      rewriter.getIndexAttr(0));
    offsets.front() = rewriter.getIndexAttr(index);
    return offsets;
  };

  for (unsigned index : order) {
    Value piece = pieces[index];
    auto pieceType = cast<RankedTensorType>(piece.getType());
    // The loop writes its slice of the stack; the stack's sizes (the first
    // piece's) bound every piece, whose op checks its own sizes against
    // that slice's.
    if (OpOperand *output = emptyOutputOf(piece);
        output && pieceType == sliceType) {
      Operation *empty = output->get().getDefiningOp();
      rewriter.setInsertionPoint(output->getOwner());
      Value slice =
          tensor::ExtractSliceOp::create(rewriter, loc, pieceType, stack,
                                         offsetsOf(index), sliceSizes, strides);
      output->set(slice);
      if (empty->use_empty())
        rewriter.eraseOp(empty);
    }
    // After the piece and the stack so far (made after the first piece's
    // op where no loop makes it).
    Operation *producer = producerOf(piece);
    if (producer && stack.getDefiningOp()->isBeforeInBlock(producer))
      rewriter.setInsertionPointAfter(producer);
    else
      rewriter.setInsertionPointAfterValue(stack);
    // A piece of other static sizes than the stack's is cast to them (a
    // view), and copied.
    if (pieceType != sliceType)
      piece = tensor::CastOp::create(rewriter, loc, sliceType, piece);
    stack = tensor::InsertSliceOp::create(
        rewriter, loc, piece, stack, offsetsOf(index), sliceSizes, strides);
  }
  SmallVector<Operation *> expansions;
  for (Value input : concat.getInputs())
    expansions.push_back(input.getDefiningOp());
  rewriter.replaceOp(concat, stack);
  // With the expansions go the sizes they read of the pieces: a size read
  // of a piece's buffer would keep its op from writing the stack.
  for (Operation *expansion : expansions) {
    if (!expansion->use_empty())
      continue;
    SmallVector<Value> sizes(expansion->getOperands().drop_front());
    rewriter.eraseOp(expansion);
    for (Value size : sizes)
      if (Operation *read = size.getDefiningOp<tensor::DimOp>();
          read && read->use_empty())
        rewriter.eraseOp(read);
  }
}

/// Lets each op on buffers outside a tile loop read a view of consecutive
/// rows in place (a packed source's partition) where bufferization copies
/// it into a new buffer for the op alone (ops outside tile loops take
/// whole buffers, which such a view is: attnres-launch-kernels addresses
/// it from its offset). Between the copy and the op only sizes, views,
/// allocations and copies into other buffers.
void readViewsInPlace(ModuleOp module) {
  SmallVector<Operation *> ops;
  module.walk([&](Operation *op) {
    if (mlir::attnres::isOpOnBuffers(op) &&
        !isa<scf::ForallOp>(op->getParentOp()))
      ops.push_back(op);
  });
  for (Operation *op : ops) {
    unsigned firstOut = firstOutOf(op);
    for (unsigned index = 0; index < firstOut; ++index) {
      Value copied = op->getOperand(index);
      auto alloc = copied.getDefiningOp<gpu::AllocOp>();
      if (!alloc || alloc.getAsyncToken() ||
          alloc->getBlock() != op->getBlock())
        continue;
      Operation *copy = nullptr;
      bool onlyThese = true;
      for (Operation *user : copied.getUsers()) {
        if (user == op)
          continue;
        if (copyEnds(user).second == copied && !copy)
          copy = user;
        else
          onlyThese = false;
      }
      if (!onlyThese || !copy || copy->getBlock() != op->getBlock() ||
          !copy->isBeforeInBlock(op) ||
          llvm::count(op->getOperands(), copied) != 1)
        continue;
      Value view = copyEnds(copy).first;
      if (!isDenseView(view))
        continue;
      Value buffer = bufferOf(view);
      bool untouched = true;
      for (Operation *between = copy->getNextNode(); between != op;
           between = between->getNextNode()) {
        if (isMemoryEffectFree(between) ||
            isa<ViewLikeOpInterface, memref::DimOp, gpu::AllocOp>(between))
          continue;
        auto [from, to] = copyEnds(between);
        untouched &= from && bufferOf(to) != buffer;
      }
      for (Value out : op->getOperands().drop_front(firstOut))
        untouched &= bufferOf(out) != buffer;
      if (!untouched)
        continue;
      op->setOperand(index, view);
      copy->erase();
      alloc->erase();
    }
  }
}

/// Refuses a copy into or out of a view that remains: upstream's
/// gpu.memcpy lowering takes a buffer from its allocation's aligned start,
/// which is right for a whole buffer and for a dense view at offset 0 as
/// the target (slice 0 of a stack); a source must be a whole buffer there.
LogicalResult refuseViewCopies(ModuleOp module, StringRef pass) {
  auto addressedRight = [](Value buffer, bool target) {
    auto type = cast<MemRefType>(buffer.getType());
    if (type.getLayout().isIdentity())
      return true;
    SmallVector<int64_t> strides;
    int64_t offset;
    return target && isDenseView(buffer) &&
           succeeded(type.getStridesAndOffset(strides, offset)) && offset == 0;
  };
  WalkResult result = module.walk([&](gpu::MemcpyOp copy) {
    if (addressedRight(copy.getSrc(), /*target=*/false) &&
        addressedRight(copy.getDst(), /*target=*/true))
      return WalkResult::advance();
    copy.emitError()
        << pass
        << ": keep-host=1 copies whole device buffers only; here a copy "
           "into or out of a view remains (a piece of a stack that its op "
           "cannot write in place: an argument of the function, a result "
           "also used besides the stack; or a slice of a buffer that is "
           "returned)";
    return WalkResult::interrupt();
  });
  return failure(result.wasInterrupted());
}

/// Frees, at the end of the function, each device buffer bufferization
/// allocated that the function does not return (a stack of partial
/// results, say): one-shot bufferization allocates and leaves freeing to
/// the caller's pipeline, and the kept host code is that pipeline. Every
/// launch before the return has finished by then (the host code waits for
/// each).
void freeTemporaries(func::FuncOp function) {
  for (Block &block : function.getBody()) {
    auto ret = dyn_cast<func::ReturnOp>(block.getTerminator());
    if (!ret)
      continue;
    llvm::DenseSet<Value> returned;
    for (Value value : ret.getOperands())
      returned.insert(bufferOf(value));
    SmallVector<gpu::AllocOp> temporaries;
    for (auto alloc : block.getOps<gpu::AllocOp>())
      if (!alloc.getAsyncToken() && !returned.contains(alloc.getMemref()) &&
          llvm::none_of(alloc.getMemref().getUsers(), [](Operation *user) {
            return isa<gpu::DeallocOp, memref::DeallocOp>(user);
          }))
        temporaries.push_back(alloc);
    OpBuilder b(ret);
    for (gpu::AllocOp alloc : temporaries)
      gpu::DeallocOp::create(b, alloc.getLoc(), /*asyncToken=*/Type(),
                             ValueRange(), alloc.getMemref());
  }
}

struct BufferizeHostPass
    : mlir::attnres::impl::AttnResBufferizeHostBase<BufferizeHostPass> {
  void getDependentDialects(DialectRegistry &registry) const override {
    Base::getDependentDialects(registry);
    mlir::attnres::registerBufferizableOpInterfaceExternalModels(registry);
    bufferization::func_ext::registerBufferizableOpInterfaceExternalModels(
        registry);
    tensor::registerBufferizableOpInterfaceExternalModels(registry);
  }

  void runOnOperation() override {
    // What may be in device memory (on its own, the pass is given anything).
    bool hostOnly = true;
    for (auto function : getOperation().getOps<func::FuncOp>())
      hostOnly &= succeeded(checkKeptFunction(function, getArgument()));
    if (!hostOnly)
      return signalPassFailure();
    SmallVector<tensor::ConcatOp> stacks;
    getOperation().walk([&](tensor::ConcatOp concat) {
      if (isa<func::FuncOp>(concat->getParentOp()))
        stacks.push_back(concat);
    });
    for (tensor::ConcatOp concat : stacks)
      stackInPlace(concat);
    bufferization::OneShotBufferizationOptions options;
    options.bufferizeFunctionBoundaries = true;
    options.setFunctionBoundaryTypeConversion(
        bufferization::LayoutMapOption::IdentityLayoutMap);
    // The kernels read and write these buffers.
    options.allocationFn = [](OpBuilder &b, Location loc, MemRefType type,
                              ValueRange dynamicSizes,
                              unsigned) -> FailureOr<Value> {
      return allocateOnDevice(b, loc, type, dynamicSizes);
    };
    // Copies arise where a tile loop's op writes a buffer of its own (made
    // writes into the loop's outputs below); should another, it must not be
    // a host loop over device memory.
    options.memCpyFn = [](OpBuilder &b, Location loc, Value from,
                          Value to) -> LogicalResult {
      // A piece written in place into its stack (stackInPlace) is copied
      // onto itself: nothing to do.
      if (isSameView(from, to))
        return success();
      gpu::MemcpyOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), to,
                            from);
      return success();
    };
    bufferization::BufferizationState state;
    if (failed(bufferization::runOneShotModuleBufferize(getOperation(), options,
                                                        state)))
      return signalPassFailure();
    writeOutsInPlace(getOperation());
    readViewsInPlace(getOperation());
    for (auto function : getOperation().getOps<func::FuncOp>())
      freeTemporaries(function);
    // A tile loop's op must write its tiles of the loop's outputs: a buffer
    // of its own would be copied on the host.
    WalkResult unwritten = getOperation().walk([&](Operation *op) {
      if (!mlir::attnres::isOpOnBuffers(op) ||
          !isa<scf::ForallOp>(op->getParentOp()))
        return WalkResult::advance();
      for (Value operand : op->getOperands())
        if (Operation *definition = operand.getDefiningOp();
            isa_and_nonnull<memref::AllocOp, gpu::AllocOp>(definition) &&
            definition->getParentOp() == op->getParentOp()) {
          op->emitError()
              << getArgument()
              << ": the tile loop's op reads or writes a buffer of its own, "
                 "a copy bufferization makes, rather than views of the "
                 "loop's buffers (an output read in the loop, say, or a "
                 "slice whose rows are not contiguous)";
          return WalkResult::interrupt();
        }
      return WalkResult::advance();
    });
    if (unwritten.wasInterrupted() ||
        failed(refuseViewCopies(getOperation(), getArgument())))
      signalPassFailure();
  }
};

} // namespace
