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
#include "attnres/Dialect/AttnRes/Transforms/BufferizableOpInterfaceImpl.h"

#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Transforms/FuncBufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/Transforms/OneShotModuleBufferize.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESBUFFERIZEHOST
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;

namespace {

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
    // No copy arises from what checkKeptFunction lets through (the
    // arguments are dense and reshapes are views); should one, it must
    // not be a host loop over device memory.
    options.memCpyFn = [](OpBuilder &b, Location loc, Value from,
                          Value to) -> LogicalResult {
      gpu::MemcpyOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), to,
                            from);
      return success();
    };
    bufferization::BufferizationState state;
    if (failed(bufferization::runOneShotModuleBufferize(getOperation(), options,
                                                        state)))
      signalPassFailure();
  }
};

} // namespace
