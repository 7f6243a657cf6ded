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
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"

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
  ValueRange outs = op->getOperands().take_back(
      op->getAttrOfType<DenseI32ArrayAttr>("operandSegmentSizes")
          .asArrayRef()
          .back());
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
    unsigned outCount =
        op->getAttrOfType<DenseI32ArrayAttr>("operandSegmentSizes")
            .asArrayRef()
            .back();
    unsigned firstOut = op->getNumOperands() - outCount;
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
      gpu::MemcpyOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), to,
                            from);
      return success();
    };
    bufferization::BufferizationState state;
    if (failed(bufferization::runOneShotModuleBufferize(getOperation(), options,
                                                        state)))
      return signalPassFailure();
    writeOutsInPlace(getOperation());
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
    if (unwritten.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
