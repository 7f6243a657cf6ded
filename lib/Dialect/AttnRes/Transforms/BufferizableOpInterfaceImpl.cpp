//===- BufferizableOpInterfaceImpl.cpp - bufferize the attnres ops --------===//
//
// An attnres op on tensors reads every operand and returns new values, so
// on buffers it reads its operands' buffers in place (a tile loop's op its
// views, where their rows are contiguous) and writes into new ones: the op
// on buffers
// takes the same operands and attributes, and the allocated buffers as
// `outs`, in the order of the results. An accumulating backward's source
// gradients are the exception: each is written into the buffer of the
// gradient it accumulates into (destination-passing style), which the op on
// buffers reads and writes (`accumulate`).
//
//===----------------------------------------------------------------------===//

#include "attnres/Dialect/AttnRes/Transforms/BufferizableOpInterfaceImpl.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Bufferization/IR/BufferizableOpInterface.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::bufferization;

namespace {

/// The gradients an accumulating backward adds into (none for other ops).
OperandRange accumulatedOperands(Operation *op) {
  if (auto backward = dyn_cast<BackwardOp>(op))
    return backward.getAccumulated();
  return op->getOperands().take_back(0);
}

/// The accumulated gradient `operand` is, or -1.
int64_t accumulatedIndex(Operation *op, OpOperand &operand) {
  OperandRange accumulated = accumulatedOperands(op);
  if (accumulated.empty() ||
      operand.getOperandNumber() < accumulated.getBeginOperandIndex())
    return -1;
  return operand.getOperandNumber() - accumulated.getBeginOperandIndex();
}

template <typename OpT, typename IntoOpT>
struct AttnResOpInterface : public BufferizableOpInterface::ExternalModel<
                                AttnResOpInterface<OpT, IntoOpT>, OpT> {
  bool bufferizesToAllocation(Operation *op, Value result) const {
    return cast<OpResult>(result).getResultNumber() >=
           accumulatedOperands(op).size();
  }

  bool bufferizesToMemoryRead(Operation *, OpOperand &,
                              const AnalysisState &) const {
    return true;
  }

  bool bufferizesToMemoryWrite(Operation *op, OpOperand &operand,
                               const AnalysisState &) const {
    return accumulatedIndex(op, operand) >= 0;
  }

  AliasingValueList getAliasingValues(Operation *op, OpOperand &operand,
                                      const AnalysisState &) const {
    int64_t index = accumulatedIndex(op, operand);
    if (index < 0)
      return {};
    return {{op->getResult(index), BufferRelation::Equivalent}};
  }

  LogicalResult bufferize(Operation *op, RewriterBase &rewriter,
                          const BufferizationOptions &options,
                          BufferizationState &state) const {
    Location loc = op->getLoc();
    OperandRange accumulated = accumulatedOperands(op);
    SmallVector<Value> operands, accumulatedBuffers;
    for (OpOperand &opOperand : op->getOpOperands()) {
      Value operand = opOperand.get();
      FailureOr<Value> buffer = getBuffer(rewriter, operand, options, state);
      if (failed(buffer))
        return failure();
      // A tile loop's op (in an scf.forall) reads its tiles in place: views
      // whose rows are contiguous. Elsewhere the op takes whole buffers,
      // which its launches address from their first element: any other
      // layout is cast where it is the identity's, else copied.
      auto type = cast<MemRefType>(buffer->getType());
      bool tile = isa_and_nonnull<scf::ForallOp>(op->getParentOp());
      if (tile ? !hasContiguousRows(type) : !type.getLayout().isIdentity()) {
        buffer = castOrReallocMemRefValue(
            rewriter, *buffer,
            MemRefType::get(type.getShape(), type.getElementType(),
                            MemRefLayoutAttrInterface(), type.getMemorySpace()),
            options);
        if (failed(buffer))
          return failure();
      }
      (accumulatedIndex(op, opOperand) >= 0 ? accumulatedBuffers : operands)
          .push_back(*buffer);
    }

    ReifiedRankedShapedTypeDims shapes;
    if (failed(reifyResultShapes(rewriter, op, shapes)))
      return op->emitError("cannot size the buffers of the op's results");
    SmallVector<Value> outs(accumulatedBuffers);
    for (auto [result, shape] : llvm::zip_equal(
             op->getResults().drop_front(accumulatedBuffers.size()),
             ArrayRef(shapes).drop_front(accumulatedBuffers.size()))) {
      auto tensorType = cast<TensorType>(result.getType());
      std::optional<Attribute> memorySpace =
          options.defaultMemorySpaceFn(tensorType);
      if (!memorySpace)
        return op->emitError("no memory space for the buffer of result #")
               << cast<OpResult>(result).getResultNumber();
      auto type = cast<MemRefType>(
          getMemRefTypeWithStaticIdentityLayout(tensorType, *memorySpace));
      SmallVector<Value> dynamicSizes;
      for (auto [dim, size] : llvm::enumerate(shape))
        if (type.isDynamicDim(dim))
          dynamicSizes.push_back(
              getValueOrCreateConstantIndexOp(rewriter, loc, size));
      FailureOr<Value> buffer =
          options.createAlloc(rewriter, loc, type, dynamicSizes);
      if (failed(buffer))
        return failure();
      outs.push_back(*buffer);
    }

    // The same operands and attributes (discardable ones too, such as the
    // kernels convert-attnres-to-gpu names), and `outs` as the last operand
    // segment.
    OperationState into(loc, IntoOpT::getOperationName());
    into.addOperands(operands);
    into.addOperands(outs);
    for (NamedAttribute attribute : op->getAttrs()) {
      if (attribute.getName() == "resultSegmentSizes")
        continue;
      if (attribute.getName() == "operandSegmentSizes") {
        SmallVector<int32_t> sizes(
            cast<DenseI32ArrayAttr>(attribute.getValue()).asArrayRef());
        // The accumulated gradients, the backward's last segment, become
        // its first outs.
        if (isa<BackwardOp>(op))
          sizes.pop_back();
        sizes.push_back(static_cast<int32_t>(outs.size()));
        into.addAttribute(attribute.getName(),
                          rewriter.getDenseI32ArrayAttr(sizes));
        continue;
      }
      into.addAttribute(attribute.getName(), attribute.getValue());
    }
    if (!accumulated.empty())
      into.addAttribute(BackwardIntoOp::getAccumulateAttrName(into.name),
                        rewriter.getUnitAttr());
    rewriter.create(into);
    replaceOpWithBufferizedValues(rewriter, op, outs);
    return success();
  }
};

} // namespace

void mlir::attnres::registerBufferizableOpInterfaceExternalModels(
    DialectRegistry &registry) {
  registry.addExtension(+[](MLIRContext *context, AttnResDialect *) {
    ForwardOp::attachInterface<AttnResOpInterface<ForwardOp, ForwardIntoOp>>(
        *context);
    BackwardOp::attachInterface<AttnResOpInterface<BackwardOp, BackwardIntoOp>>(
        *context);
    PartitionReduceOp::attachInterface<
        AttnResOpInterface<PartitionReduceOp, PartitionReduceIntoOp>>(*context);
  });
}
