//===- HostLaunch.cpp - attnres ops as launches of their kernels ----------===//
//
// With keep-host, convert-attnres-to-gpu keeps the functions and replaces
// each op by the host code that runs it: its operands as buffers, device
// allocations for its results, the table of source rows, and a
// gpu.launch_func of its kernel, whose grid and arguments come from the
// description the kernel was recorded with (what the bundle manifest is
// written from), so the launch rule exists once. Upstream's bufferization
// and gpu-to-llvm lower the result like any host code.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"

using namespace mlir;
using namespace mlir::attnres;

namespace {

/// The address of a buffer's first element, as the kernels take it.
Value addressOf(OpBuilder &b, Location loc, Value buffer) {
  Value index = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, buffer);
  return arith::IndexCastOp::create(b, loc, b.getI64Type(), index);
}

Value globalPointer(OpBuilder &b, Location loc, Value address) {
  return LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(b.getContext(), 1), address);
}

MemRefType bufferTypeOf(Type tensor) {
  auto type = cast<RankedTensorType>(tensor);
  return MemRefType::get(type.getShape(), type.getElementType());
}

Value constantIndex(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

/// The runtime's attnresGpuRefuseLaunch(const char *reason), declared in the
/// op's module once.
func::FuncOp refusalEntryPoint(Operation *op) {
  auto module = op->getParentOfType<ModuleOp>();
  constexpr StringLiteral name = "attnresGpuRefuseLaunch";
  if (auto existing = module.lookupSymbol<func::FuncOp>(name))
    return existing;
  OpBuilder b(module.getBodyRegion());
  auto type = FunctionType::get(
      op->getContext(), {LLVM::LLVMPointerType::get(op->getContext())}, {});
  auto function = func::FuncOp::create(b, module.getLoc(), name, type);
  function.setPrivate();
  return function;
}

} // namespace

LogicalResult gpu_kernels::replaceByLaunch(ForwardOp op, gpu::GPUFuncOp kernel,
                                           const KernelInfo &info,
                                           unsigned &refusals) {
  OpBuilder b(op);
  Location loc = op.getLoc();
  Type i64 = b.getI64Type();

  // The token dimensions T... of the sources, and N, their product.
  Value first = op.getSources().front();
  int64_t lead = op.getPacked() ? 1 : 0;
  RankedTensorType sourceType = op.getSourceType();
  SmallVector<Value> tokenSizes;
  Value tokens = constantIndex(b, loc, 1);
  for (int64_t dim = 0; dim + 1 < sourceType.getRank(); ++dim) {
    Value size = tensor::DimOp::create(b, loc, first, dim + lead);
    tokenSizes.push_back(size);
    tokens = arith::MulIOp::create(b, loc, tokens, size);
  }
  Value tokens64 = arith::IndexCastOp::create(b, loc, i64, tokens);

  // The operands as buffers, read in place.
  auto asBuffer = [&](Value tensor) -> Value {
    if (!tensor)
      return {};
    auto buffer = bufferization::ToBufferOp::create(
        b, loc, bufferTypeOf(tensor.getType()), tensor, /*readOnly=*/true);
    return buffer;
  };
  SmallVector<Value> sourceBuffers;
  for (Value source : op.getSources())
    sourceBuffers.push_back(asBuffer(source));
  Value query = asBuffer(op.getQuery());
  Value keyNorm = asBuffer(op.getKeyNormWeight());
  Value outputNorm = asBuffer(op.getOutputNormWeight());

  // A device buffer for every result, its dynamic sizes from T...: results
  // are [M?, T..., D], [M?, T...] or [M?, T..., D/2].
  int64_t queryDims = op.isMultiQuery() ? 1 : 0;
  auto allocate = [&](Value result) -> Value {
    if (!result)
      return {};
    MemRefType type = bufferTypeOf(result.getType());
    SmallVector<Value> dynamic;
    for (int64_t dim = 0; dim < type.getRank(); ++dim)
      if (type.isDynamicDim(dim))
        dynamic.push_back(tokenSizes[dim - queryDims]);
    return gpu::AllocOp::create(b, loc, type, /*asyncToken=*/Type(),
                                /*asyncDependencies=*/ValueRange(), dynamic,
                                /*symbolOperands=*/ValueRange(),
                                /*hostShared=*/false)
        .getMemref();
  };
  Value o = allocate(op.getOutput()), lse = allocate(op.getLse());
  Value oPre = allocate(op.getOPre());
  Value residual = allocate(op.getOPreResidual());

  // The kernel's vector loads need the alignments its description states;
  // the runtime checks them before a launch, and so does this code (a
  // caller's buffer may be a view at any offset): a misaligned buffer skips
  // the launch and is reported through the runtime (attnresGpuRefuseLaunch),
  // as a failing driver call is, instead of reading wrong rows.
  func::FuncOp refuse = refusalEntryPoint(op);
  Value allAligned = arith::ConstantIntOp::create(b, loc, 1, 1);
  auto requireAligned = [&](Value address, int64_t alignment,
                            const Twine &what) {
    if (alignment <= 1)
      return;
    Value remainder = arith::RemUIOp::create(
        b, loc, address, arith::ConstantIntOp::create(b, loc, i64, alignment));
    Value aligned =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, remainder,
                              arith::ConstantIntOp::create(b, loc, i64, 0));
    Value misaligned = arith::XOrIOp::create(
        b, loc, aligned, arith::ConstantIntOp::create(b, loc, 1, 1));
    std::string reason =
        (what + " must be aligned to " + Twine(alignment) +
         " bytes for kernel " + info.name + "; the launch was skipped")
            .str();
    // The message's global is made here, where the builder is inside the
    // module: the body of the scf.if is not attached while it is built.
    Value message = LLVM::createGlobalString(
        loc, b, ("attnres_refusal_" + Twine(++refusals)).str(),
        StringRef(reason.c_str(), reason.size() + 1), LLVM::Linkage::Internal);
    scf::IfOp::create(b, loc, misaligned, [&](OpBuilder &nested, Location at) {
      func::CallOp::create(nested, at, refuse, ValueRange{message});
      scf::YieldOp::create(nested, at);
    });
    allAligned = arith::AndIOp::create(b, loc, allAligned, aligned);
  };
  SmallVector<Value> callerBuffers = {query, keyNorm, outputNorm};
  // Rows are read in vectors of the kernel's width.
  int64_t elementBytes =
      llvm::divideCeil(sourceType.getElementTypeBitWidth(), 8);
  int64_t rowAlignment = info.vectorWidth * elementBytes;

  // The table of the L source rows' addresses: each list source, or each
  // row of the packed tensor. Filled on the host, copied to the device.
  int64_t L = op.getNumSourceValues();
  auto tableType = MemRefType::get({L}, i64);
  Value hostTable = memref::AllocaOp::create(b, loc, tableType);
  Value rowBytes;
  if (op.getPacked()) {
    rowBytes = arith::MulIOp::create(
        b, loc, tokens64,
        arith::ConstantIntOp::create(
            b, loc, i64, sourceType.getShape().back() * elementBytes));
  }
  for (int64_t l = 0; l < L; ++l) {
    Value address;
    if (op.getPacked())
      address = arith::AddIOp::create(
          b, loc, addressOf(b, loc, sourceBuffers[0]),
          arith::MulIOp::create(b, loc, rowBytes,
                                arith::ConstantIntOp::create(b, loc, i64, l)));
    else
      address = addressOf(b, loc, sourceBuffers[l]);
    requireAligned(address, rowAlignment, "the row of source " + Twine(l));
    memref::StoreOp::create(b, loc, address, hostTable,
                            ValueRange{constantIndex(b, loc, l)});
  }
  Value table =
      gpu::AllocOp::create(b, loc, tableType, Type(), ValueRange(),
                           ValueRange(), ValueRange(), /*hostShared=*/false)
          .getMemref();
  gpu::MemcpyOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), table,
                        hostTable);

  // The kernel's arguments, by the names its description gives them.
  llvm::StringMap<Value> buffers = {{"sources", table},
                                    {"query", query},
                                    {"key_norm", keyNorm},
                                    {"output_norm", outputNorm},
                                    {"o", o},
                                    {"lse", lse},
                                    {"o_pre", oPre},
                                    {"o_pre_residual", residual}};
  Value queries = arith::ConstantIntOp::create(b, loc, i64, op.getNumQueries());
  llvm::StringMap<Value> integers = {
      {"num_tokens", tokens64},
      {"num_rows", arith::MulIOp::create(b, loc, queries, tokens64)},
      {"rows_per_weight", tokens64},
      {"num_partitions", arith::ConstantIntOp::create(b, loc, i64, 1)}};
  SmallVector<Value> arguments;
  for (const auto &argument : info.arguments) {
    StringRef argumentName = argument.name;
    bool integer = argument.kind == "i64";
    Value value =
        integer ? integers.lookup(argumentName) : buffers.lookup(argumentName);
    if (!value)
      return op.emitError("convert-attnres-to-gpu: keep-host has no value for "
                          "argument '")
             << argumentName << "' of kernel " << info.name;
    if (integer) {
      arguments.push_back(value);
      continue;
    }
    Value address = addressOf(b, loc, value);
    if (llvm::is_contained(callerBuffers, value))
      requireAligned(address, argument.alignment, "'" + argumentName + "'");
    arguments.push_back(globalPointer(b, loc, address));
  }

  // The grid, from the kernel's rule: ceil(symbol * scale / divisor).
  SmallVector<Value, 3> grid;
  for (const GridDimension &rule : info.grid) {
    if (rule.symbol != "1" && rule.symbol != "N")
      return op.emitError("convert-attnres-to-gpu: keep-host cannot size the "
                          "grid symbol '")
             << rule.symbol << "' of kernel " << info.name;
    Value value = rule.symbol == "N" ? tokens : constantIndex(b, loc, 1);
    value =
        arith::MulIOp::create(b, loc, value, constantIndex(b, loc, rule.scale));
    grid.push_back(arith::CeilDivUIOp::create(
        b, loc, value, constantIndex(b, loc, rule.divisor)));
  }
  Value block = constantIndex(b, loc, info.block);
  Value one = constantIndex(b, loc, 1);
  // No tokens, no launch (a grid of no blocks is an error for the driver);
  // nor with a misaligned buffer.
  Value anyTokens = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt,
                                          tokens, constantIndex(b, loc, 0));
  Value launch = arith::AndIOp::create(b, loc, anyTokens, allAligned);
  scf::IfOp::create(b, loc, launch, [&](OpBuilder &nested, Location at) {
    gpu::LaunchFuncOp::create(nested, at, kernel,
                              gpu::KernelDim3{grid[0], grid[1], grid[2]},
                              gpu::KernelDim3{block, one, one},
                              /*dynamicSharedMemorySize=*/Value(), arguments);
    scf::YieldOp::create(nested, at);
  });
  gpu::DeallocOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), table);

  // The results as tensors of the device buffers.
  SmallVector<Value> buffersOfResults;
  for (Value buffer : {o, lse, oPre, residual})
    if (buffer)
      buffersOfResults.push_back(buffer);
  SmallVector<Value> results;
  for (auto [result, buffer] : llvm::zip(op->getResults(), buffersOfResults))
    results.push_back(bufferization::ToTensorOp::create(
        b, loc, result.getType(), buffer, /*restrict=*/true,
        /*writable=*/true));
  op->replaceAllUsesWith(results);
  op->erase();
  return success();
}
