//===- HostLaunch.cpp - attnres ops as launches of their kernels ----------===//
//
// attnres-launch-kernels: after convert-attnres-to-gpu (keep-host), which
// keeps the functions and names on each op its kernels, and
// attnres-bufferize-host, which puts them on device buffers, each op on
// buffers becomes the host code that runs it: its workspaces, the tables
// of source rows, alignment checks of its buffers, and gpu.launch_func of
// its kernels, whose grids and arguments come from the descriptions the
// kernels were recorded with (what the bundle manifest is written from) and
// whose block and partition counts come from the launch rules of
// attnres/Bundle/LaunchRules.h, computed here in IR from the token count at
// run time: each rule exists once. Upstream's gpu-to-llvm lowers the result
// like any host code.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Bundle/LaunchRules.h"
#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_ATTNRESLAUNCHKERNELS
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::attnres::gpu_kernels;

namespace {

/// The arithmetic of LaunchRules.h's rules on i64 IR values.
struct IRIntegers {
  using Value = mlir::Value;
  OpBuilder &b;
  Location loc;

  Value constant(int64_t value) const {
    return arith::ConstantIntOp::create(b, loc, b.getI64Type(), value);
  }
  Value min(Value x, Value y) const {
    return arith::MinSIOp::create(b, loc, x, y);
  }
  Value max(Value x, Value y) const {
    return arith::MaxSIOp::create(b, loc, x, y);
  }
  Value div(Value x, Value y) const {
    return arith::DivSIOp::create(b, loc, x, y);
  }
  Value ceilDiv(Value x, Value y) const {
    return arith::CeilDivSIOp::create(b, loc, x, y);
  }
  Value mul(Value x, Value y) const {
    return arith::MulIOp::create(b, loc, x, y);
  }
  Value add(Value x, Value y) const {
    return arith::AddIOp::create(b, loc, x, y);
  }
};

int64_t bytesOf(Type type) {
  return llvm::divideCeil(type.getIntOrFloatBitWidth(), 8);
}

/// A function of the runtime (libAttnResRuntime, attnres-c/GpuWrappers.h)
/// the host code calls: a pointer (a kernel's name or a message), then
/// `i64Arguments` i64, returning an i64 or nothing.
struct RuntimeFunction {
  const char *name;
  unsigned i64Arguments;
  bool returnsI64;

  FunctionType type(MLIRContext *context) const {
    auto i64 = IntegerType::get(context, 64);
    SmallVector<Type> arguments(1 + i64Arguments, i64);
    arguments[0] = LLVM::LLVMPointerType::get(context);
    return FunctionType::get(context, arguments,
                             returnsI64 ? TypeRange{i64} : TypeRange{});
  }
};
constexpr RuntimeFunction kResidentBlocks{"attnresGpuResidentBlocks", 1, true};
constexpr RuntimeFunction kClusterCapacity{"attnresGpuClusterCapacity", 2,
                                           true};
constexpr RuntimeFunction kRefuseLaunch{"attnresGpuRefuseLaunch", 0, false};
constexpr RuntimeFunction kRuntimeFunctions[] = {
    kResidentBlocks, kClusterCapacity, kRefuseLaunch};

/// `function`, declared in the op's module once.
func::FuncOp runtimeFunction(Operation *op, const RuntimeFunction &function) {
  auto module = op->getParentOfType<ModuleOp>();
  // One the module declared itself was checked to have this type
  // (checkRuntimeSymbols).
  if (auto existing = module.lookupSymbol<func::FuncOp>(function.name))
    return existing;
  OpBuilder b(module.getBodyRegion());
  auto declaration = func::FuncOp::create(b, module.getLoc(), function.name,
                                          function.type(op->getContext()));
  declaration.setPrivate();
  return declaration;
}

/// The host code of one op on buffers: tables, workspaces, checks and
/// launches.
/// Every alignment check comes before the first launch, which each check
/// guards.
class HostLauncher {
public:
  HostLauncher(Operation *op, unsigned &refusals)
      : op(op), b(op), loc(op->getLoc()), rules{b, loc}, refusals(refusals) {
    allAligned = arith::ConstantIntOp::create(b, loc, 1, 1);
  }

  OpBuilder &builder() { return b; }
  const IRIntegers &arithmetic() const { return rules; }
  Value index(int64_t value) {
    return arith::ConstantIndexOp::create(b, loc, value);
  }
  Value i64(int64_t value) { return rules.constant(value); }
  Value toI64(Value indexValue) {
    return arith::IndexCastOp::create(b, loc, b.getI64Type(), indexValue);
  }
  Value toIndex(Value integer) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), integer);
  }

  Value allocate(MemRefType type, ValueRange dynamicSizes) {
    return allocateOnDevice(b, loc, type, dynamicSizes);
  }

  /// A device buffer freed after the launches (tables, workspaces).
  Value allocateTemporary(MemRefType type, ValueRange dynamicSizes) {
    Value buffer = allocate(type, dynamicSizes);
    temporaries.push_back(buffer);
    return buffer;
  }

  /// The address of a buffer's first element, as the kernels take it (a
  /// view's lies `offset` elements past its allocation's).
  Value addressOf(Value buffer) {
    Value address =
        memref::ExtractAlignedPointerAsIndexOp::create(b, loc, buffer);
    auto type = cast<MemRefType>(buffer.getType());
    if (!type.getLayout().isIdentity()) {
      auto metadata = memref::ExtractStridedMetadataOp::create(b, loc, buffer);
      Value bytes =
          arith::MulIOp::create(b, loc, metadata.getOffset(),
                                index(type.getElementTypeBitWidth() / 8));
      address = arith::AddIOp::create(b, loc, address, bytes);
    }
    return toI64(address);
  }

  /// Binds each present buffer's address to its kernel argument's name.
  void bindAddresses(llvm::StringMap<Value> &values,
                     ArrayRef<std::pair<StringRef, Value>> buffers) {
    for (auto [name, buffer] : buffers)
      if (buffer)
        values[name] = addressOf(buffer);
  }

  /// Skips every launch of the op, with a message naming `what`, where
  /// `address` is not a multiple of `alignment`: a caller's buffer may be a
  /// view at any offset, and the kernel's vector loads would read wrong
  /// rows. The runtime's bundle launches check the same.
  void requireAligned(Value address, int64_t alignment, const Twine &what,
                      StringRef kernel) {
    if (alignment <= 1)
      return;
    Value remainder = arith::RemUIOp::create(b, loc, address, i64(alignment));
    Value aligned = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                          remainder, i64(0));
    require(aligned, what + " must be aligned to " + Twine(alignment) +
                         " bytes for kernel " + kernel);
  }

  /// Skips every launch of the op, with a message naming `what`, where the
  /// index values `a` and `b` differ.
  void requireEqual(Value x, Value y, const Twine &what) {
    require(arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, x, y),
            what);
  }

  /// Skips every launch of the op where `holds` (i1) does not, with a
  /// message `reason` through the runtime's attnresGpuRefuseLaunch.
  void require(Value holds, const Twine &reason) {
    Value fails = arith::XOrIOp::create(
        b, loc, holds, arith::ConstantIntOp::create(b, loc, 1, 1));
    Value message = globalString("attnres_refusal_" + Twine(++refusals),
                                 (reason + "; the launch was skipped").str());
    func::FuncOp refuse = runtimeFunction(op, kRefuseLaunch);
    scf::IfOp::create(b, loc, fails, [&](OpBuilder &nested, Location at) {
      func::CallOp::create(nested, at, refuse, ValueRange{message});
      scf::YieldOp::create(nested, at);
    });
    allAligned = arith::AndIOp::create(b, loc, allAligned, holds);
  }

  /// Checks the op's buffers among `values` against the alignment of the
  /// kernel argument each is bound to: every buffer argument but those
  /// this code makes (`madeHere`: tables, workspaces), so that a buffer a
  /// kernel gains is checked unless it is one of those.
  void checkArguments(const KernelInfo &info,
                      const llvm::StringMap<Value> &values,
                      const llvm::StringSet<> &madeHere) {
    for (const auto &argument : info.arguments) {
      if (argument.kind == "i64" || madeHere.contains(argument.name))
        continue;
      // Once a buffer, at the first kernel's alignment unless a later one
      // needs more.
      int64_t &checked = checkedAlignment[argument.name];
      if (Value address = values.lookup(argument.name);
          address && argument.alignment > checked) {
        requireAligned(address, argument.alignment, "'" + argument.name + "'",
                       info.name);
        checked = argument.alignment;
      }
    }
  }

  /// A device table of the addresses `rows` (i64), filled on the host.
  Value table(ArrayRef<Value> rows) {
    auto type = MemRefType::get({int64_t(rows.size())}, b.getI64Type());
    Value host = memref::AllocaOp::create(b, loc, type);
    for (auto [l, address] : llvm::enumerate(rows))
      memref::StoreOp::create(b, loc, address, host, ValueRange{index(l)});
    Value device = allocateTemporary(type, {});
    gpu::MemcpyOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(), device,
                          host);
    return device;
  }

  /// Blocks of `kernel` the device holds at once (attnresGpuResidentBlocks:
  /// the driver's occupancy times the multiprocessors), from which the
  /// bundle runtime sizes launches too.
  Value residentBlocks(const KernelInfo &kernel) {
    func::FuncOp query = runtimeFunction(op, kResidentBlocks);
    return func::CallOp::create(
               b, loc, query, ValueRange{kernelName(kernel), i64(kernel.block)})
        .getResult(0);
  }

  /// Clusters of `clusterBlocks` blocks of `kernel` the device holds at
  /// once (attnresGpuClusterCapacity).
  Value clusterCapacity(const KernelInfo &kernel, int64_t clusterBlocks) {
    func::FuncOp query = runtimeFunction(op, kClusterCapacity);
    return func::CallOp::create(b, loc, query,
                                ValueRange{kernelName(kernel),
                                           i64(kernel.block),
                                           i64(clusterBlocks)})
        .getResult(0);
  }

  /// Launches `kernel` with the arguments `values` (addresses and integers,
  /// by the names of its description) on the grid of its rule, whose
  /// symbols `symbols` gives (index values); skipped where a grid
  /// dimension is empty or a check failed.
  LogicalResult launch(gpu::GPUFuncOp kernel, const KernelInfo &info,
                       const llvm::StringMap<Value> &values,
                       const llvm::StringMap<Value> &symbols) {
    SmallVector<Value> arguments;
    for (const auto &argument : info.arguments) {
      Value value = values.lookup(argument.name);
      if (!value)
        return op->emitError("attnres-launch-kernels: no value "
                             "for argument '")
               << argument.name << "' of kernel " << info.name;
      if (argument.kind != "i64")
        value = LLVM::IntToPtrOp::create(
            b, loc, LLVM::LLVMPointerType::get(b.getContext(), 1), value);
      arguments.push_back(value);
    }
    // ceil(symbol * scale / divisor).
    SmallVector<Value, 3> grid;
    Value go = allAligned;
    for (const GridDimension &rule : info.grid) {
      if (rule.symbol == "1") {
        grid.push_back(index(llvm::divideCeil(rule.scale, rule.divisor)));
        continue;
      }
      Value symbol = symbols.lookup(rule.symbol);
      if (!symbol)
        return op->emitError("attnres-launch-kernels: cannot size "
                             "the grid symbol '")
               << rule.symbol << "' of kernel " << info.name;
      Value scaled = arith::MulIOp::create(b, loc, symbol, index(rule.scale));
      grid.push_back(
          arith::CeilDivUIOp::create(b, loc, scaled, index(rule.divisor)));
      // A grid of no blocks is an error for the driver: no launch.
      go = arith::AndIOp::create(
          b, loc, go,
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt, grid.back(),
                                index(0)));
    }
    Value one = index(1);
    Value block = index(info.block);
    // The blocks along y of a clustered kernel form one cluster.
    std::optional<gpu::KernelDim3> cluster;
    if (info.clusterY)
      cluster = gpu::KernelDim3{one, grid[1], one};
    scf::IfOp::create(b, loc, go, [&](OpBuilder &nested, Location at) {
      gpu::LaunchFuncOp::create(nested, at, kernel,
                                gpu::KernelDim3{grid[0], grid[1], grid[2]},
                                gpu::KernelDim3{block, one, one},
                                /*dynamicSharedMemorySize=*/Value(), arguments,
                                /*asyncTokenType=*/Type(),
                                /*asyncDependencies=*/ValueRange(), cluster);
      scf::YieldOp::create(nested, at);
    });
    return success();
  }

  /// Frees the temporaries; the op, whose buffers the launches wrote,
  /// goes.
  void finish() {
    for (Value temporary : temporaries)
      gpu::DeallocOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(),
                             temporary);
    op->erase();
  }

  /// Runs `launch`, a launch of other code than a described kernel's,
  /// where every check passed and its grid has blocks, then frees the
  /// temporaries; the op goes.
  void guard(gpu::LaunchOp launch) {
    // At the launch, after what it was sized with.
    OpBuilder at(launch);
    Value hasBlocks = arith::CmpIOp::create(
        at, loc, arith::CmpIPredicate::sgt, launch.getGridSizeX(),
        arith::ConstantIndexOp::create(at, loc, 0));
    Value go = arith::AndIOp::create(at, loc, allAligned, hasBlocks);
    auto ifGo = scf::IfOp::create(at, loc, go);
    launch->moveBefore(ifGo.thenBlock()->getTerminator());
    b.setInsertionPointAfter(ifGo);
    finish();
  }

private:
  /// The address of the kernel's name, a global string made once.
  Value kernelName(const KernelInfo &kernel) {
    std::string symbol = "attnres_kernel_name_" + kernel.name;
    auto module = op->getParentOfType<ModuleOp>();
    if (auto existing = module.lookupSymbol<LLVM::GlobalOp>(symbol)) {
      Value address = LLVM::AddressOfOp::create(b, loc, existing);
      return LLVM::GEPOp::create(b, loc, pointerType(), existing.getType(),
                                 address, ArrayRef<LLVM::GEPArg>{0, 0});
    }
    return globalString(symbol, kernel.name);
  }

  Type pointerType() { return LLVM::LLVMPointerType::get(b.getContext()); }

  /// The address of a NUL-terminated global string. Made where the builder
  /// is, inside the module: the body of an scf.if is not attached while it
  /// is built.
  Value globalString(const Twine &symbol, StringRef text) {
    std::string terminated = (text + Twine('\0')).str();
    return LLVM::createGlobalString(loc, b, symbol.str(), terminated,
                                    LLVM::Linkage::Internal);
  }

  Operation *op;
  OpBuilder b;
  Location loc;
  IRIntegers rules;
  unsigned &refusals;
  Value allAligned;
  SmallVector<Value> temporaries;
  llvm::StringMap<int64_t> checkedAlignment;
};

/// The token count N of an op over `sources`: the product of the token
/// dimensions T... of its first source ([T..., D], or [L, T..., D] packed).
Value tokenCount(HostLauncher &host, OpBuilder &b, Location loc, Value source,
                 bool packed) {
  auto type = cast<MemRefType>(source.getType());
  Value tokens = host.index(1);
  for (int64_t dim = packed ? 1 : 0; dim + 1 < type.getRank(); ++dim)
    tokens = arith::MulIOp::create(b, loc, tokens,
                                   memref::DimOp::create(b, loc, source, dim));
  return tokens;
}

/// The addresses of the L rows of the sources (or of their gradients),
/// each checked against `rowAlignment` and named `what` and its index in a
/// refusal: each listed buffer, or row l of the packed one at
/// base + l * N * D * element size.
SmallVector<Value> sourceRows(HostLauncher &host, OpBuilder &b, Location loc,
                              ArrayRef<Value> buffers, bool packed,
                              int64_t numSources, Value tokens64,
                              int64_t rowElementBytes, int64_t rowAlignment,
                              StringRef kernel,
                              StringRef what = "the row of source ") {
  SmallVector<Value> rows;
  Value rowBytes;
  if (packed)
    rowBytes =
        arith::MulIOp::create(b, loc, tokens64, host.i64(rowElementBytes));
  for (int64_t l = 0; l < numSources; ++l) {
    Value address;
    if (packed)
      address = arith::AddIOp::create(
          b, loc, host.addressOf(buffers[0]),
          arith::MulIOp::create(b, loc, rowBytes, host.i64(l)));
    else
      address = host.addressOf(buffers[l]);
    host.requireAligned(address, rowAlignment, what + Twine(l), kernel);
    rows.push_back(address);
  }
  return rows;
}

const std::pair<gpu::GPUFuncOp, KernelInfo> *
kernelOf(Operation *op, DictionaryAttr facts, StringRef role,
         const RecordedKernels &kernels) {
  auto name = facts.getAs<StringAttr>(role);
  auto found = name ? kernels.find(name.getValue()) : kernels.end();
  if (found == kernels.end()) {
    op->emitError("attnres-launch-kernels: the module has no ")
        << role << " kernel for the op";
    return nullptr;
  }
  if (found->second.second.role != role) {
    op->emitError("attnres-launch-kernels: the op's ")
        << role << " kernel " << name << " is a " << found->second.second.role
        << " kernel";
    return nullptr;
  }
  return &found->second;
}

/// A fact attnres-launch-kernels checked to be present (validateLaunch).
int64_t integerFact(DictionaryAttr facts, StringRef name) {
  return *integerValue(facts.get(name));
}

/// What the kernels of a forward or backward take of it: its token count
/// N (an index and an i64), and their arguments by name.
struct SourceOpArguments {
  Value tokens, tokens64;
  llvm::StringMap<Value> values;
};

/// What every forward kernel takes of `op`: the device table of the
/// sources' rows (each row checked against `vectorWidth` elements, in a
/// refusal naming `kernel`), the buffers' addresses and N.
SourceOpArguments forwardArguments(HostLauncher &host, ForwardIntoOp op,
                                   int64_t vectorWidth, StringRef kernel) {
  OpBuilder &b = host.builder();
  Location loc = op.getLoc();
  SourceOpArguments arguments;
  arguments.tokens =
      tokenCount(host, b, loc, op.getSources().front(), op.getPacked());
  Value tokens64 = arguments.tokens64 = host.toI64(arguments.tokens);
  // Rows are read in vectors of the kernels' width.
  int64_t elementBytes = bytesOf(op.getSourceType().getElementType());
  SmallVector<Value> rows = sourceRows(
      host, b, loc, SmallVector<Value>(op.getSources()), op.getPacked(),
      op.getNumSourceValues(), tokens64, op.getWidth() * elementBytes,
      vectorWidth * elementBytes, kernel);
  llvm::StringMap<Value> &values = arguments.values;
  values["sources"] = host.addressOf(host.table(rows));
  host.bindAddresses(values, {{"query", op.getQuery()},
                              {"key_norm", op.getKeyNormWeight()},
                              {"output_norm", op.getOutputNormWeight()},
                              {"o", op.getOutputBuffer()},
                              {"lse", op.getLseBuffer()},
                              {"o_pre", op.getOPreBuffer()},
                              {"o_pre_residual", op.getOPreResidualBuffer()}});
  values["num_tokens"] = tokens64;
  return arguments;
}

/// What a softmax merge kernel takes of `op`: its row count (the product
/// of the partials' token dimensions T... of [P, T..., D]) and its
/// arguments by name (a refusal naming `kernel`).
struct MergeArguments {
  Value rows;
  llvm::StringMap<Value> values;
};

MergeArguments mergeArguments(HostLauncher &host, PartitionReduceIntoOp op,
                              StringRef kernel) {
  OpBuilder &b = host.builder();
  Location loc = op.getLoc();
  MergeArguments arguments;
  Value partials = op.getPartials();
  auto partialsType = cast<MemRefType>(partials.getType());
  Value rows = host.index(1);
  for (int64_t dim = 1; dim + 1 < partialsType.getRank(); ++dim)
    rows = arith::MulIOp::create(b, loc, rows,
                                 memref::DimOp::create(b, loc, partials, dim));
  arguments.rows = rows;
  Value rows64 = host.toI64(rows);
  llvm::StringMap<Value> &values = arguments.values;
  host.bindAddresses(values, {{"partial_o", partials},
                              {"partial_lse", op.getPartialLse()},
                              {"sink", op.getSink()},
                              {"output_norm", op.getOutputNormWeight()},
                              {"o", op.getOutputBuffer()},
                              {"lse", op.getLseBuffer()},
                              {"o_pre", op.getOPreBuffer()},
                              {"o_pre_residual", op.getOPreResidualBuffer()}});
  values["num_rows"] = rows64;
  values["num_partitions"] = host.i64(op.getNumPartitions());
  // A weight per row group ([K, D] weights over [K, T..., D] rows). The
  // verifier equates a static K with the partials' first token dimension;
  // a dynamic one is checked here (a row of the weight past K would be
  // read otherwise), and the division kept from 0.
  Value weightRows = rows64;
  if (auto weight = op.getOutputNormWeight();
      weight && cast<MemRefType>(weight.getType()).getRank() == 2) {
    auto weightType = cast<MemRefType>(weight.getType());
    Value groups;
    if (weightType.isDynamicDim(0)) {
      Value count = memref::DimOp::create(b, loc, weight, 0);
      host.requireEqual(count, memref::DimOp::create(b, loc, partials, 1),
                        "the output norm weight must have a row for each "
                        "index of the partials' first token dimension, for "
                        "kernel " +
                            kernel);
      groups = arith::MaxUIOp::create(b, loc, host.toI64(count), host.i64(1));
    } else {
      groups = host.i64(weightType.getShape()[0]);
    }
    weightRows = arith::DivUIOp::create(b, loc, rows64, groups);
  }
  values["rows_per_weight"] = weightRows;
  return arguments;
}

/// What every backward kernel takes of `op` (a whole backward's, a tile's
/// of a split one): the device tables of the sources' and of their
/// gradients' rows (each row checked against `vectorWidth` elements, in a
/// refusal naming `kernel`), the buffers' addresses and N.
SourceOpArguments backwardArguments(HostLauncher &host, BackwardIntoOp op,
                                    int64_t vectorWidth, StringRef kernel) {
  OpBuilder &b = host.builder();
  Location loc = op.getLoc();
  SourceOpArguments arguments;
  Value first = op.getSources().front();
  Value tokens = arguments.tokens =
      tokenCount(host, b, loc, first, op.getPacked());
  Value tokens64 = arguments.tokens64 = host.toI64(tokens);

  SmallVector<Value> sourceBuffers(op.getSources());
  SmallVector<Value> gradientBuffers(op.getGradSourceBuffers());
  llvm::StringMap<Value> &values = arguments.values;
  host.bindAddresses(values, {{"query", op.getQuery()},
                              {"key_norm", op.getKeyNormWeight()},
                              {"output_norm", op.getOutputNormWeight()},
                              {"grad", op.getGradOutput()},
                              {"lse", op.getLse()},
                              {"saved", op.getSavedOutput()},
                              {"saved_residual", op.getSavedResidual()},
                              {"grad_lse", op.getGradLse()},
                              {"dq", op.getGradQueryBuffer()},
                              {"dg", op.getGradKeyNormWeightBuffer()},
                              {"dh", op.getGradOutputNormWeightBuffer()}});

  MemRefType sourceType = op.getSourceType();
  int64_t elementBytes = bytesOf(sourceType.getElementType());
  int64_t rowElementBytes = sourceType.getShape().back() * elementBytes;
  int64_t L = op.getNumSourceValues();
  SmallVector<Value> rows =
      sourceRows(host, b, loc, sourceBuffers, op.getPacked(), L, tokens64,
                 rowElementBytes, vectorWidth * elementBytes, kernel);
  // The gradient rows are written as the source rows are read.
  SmallVector<Value> gradientRows =
      sourceRows(host, b, loc, gradientBuffers, op.getPacked(), L, tokens64,
                 rowElementBytes, vectorWidth * elementBytes, kernel,
                 "the gradient row of source ");
  values["sources"] = host.addressOf(host.table(rows));
  values["grad_sources"] = host.addressOf(host.table(gradientRows));
  values["num_tokens"] = tokens64;
  return arguments;
}

} // namespace

LogicalResult gpu_kernels::launchTile(
    Operation *whole, gpu::LaunchOp launch, int64_t vectorWidth,
    StringRef kernel, ArrayRef<std::tuple<Value, Value, std::string>> equal,
    function_ref<FailureOr<KernelInfo>(const llvm::StringMap<Value> &)> emit,
    unsigned &refusals) {
  HostLauncher host(whole, refusals);
  for (const auto &[x, y, what] : equal)
    host.requireEqual(x, y, what + " for kernel " + kernel);
  llvm::StringMap<Value> values;
  llvm::StringSet<> madeHere;
  if (auto forward = dyn_cast<ForwardIntoOp>(whole)) {
    values = forwardArguments(host, forward, vectorWidth, kernel).values;
    madeHere.insert("sources");
  } else if (auto backward = dyn_cast<BackwardIntoOp>(whole)) {
    values = backwardArguments(host, backward, vectorWidth, kernel).values;
    madeHere.insert("sources");
    madeHere.insert("grad_sources");
  } else {
    values =
        mergeArguments(host, cast<PartitionReduceIntoOp>(whole), kernel).values;
  }
  FailureOr<KernelInfo> info = emit(values);
  if (failed(info))
    return failure();
  host.checkArguments(*info, values, madeHere);
  host.guard(launch);
  return success();
}

namespace {

LogicalResult replaceForward(ForwardIntoOp op, DictionaryAttr facts,
                             const RecordedKernels &kernels,
                             const LaunchCounts &counts, unsigned &refusals) {
  const auto *whole = kernelOf(op, facts, "forward", kernels);
  const auto *partial = kernelOf(op, facts, "forward_partial", kernels);
  const auto *merge = kernelOf(op, facts, "merge", kernels);
  if (!whole || !partial || !merge)
    return failure();
  // Where the pass emitted one (sm_90 with clusters=1).
  const std::pair<gpu::GPUFuncOp, KernelInfo> *clustered = nullptr;
  if (facts.get("forward_cluster") &&
      !(clustered = kernelOf(op, facts, "forward_cluster", kernels)))
    return failure();
  HostLauncher host(op, refusals);
  OpBuilder &b = host.builder();
  Location loc = op.getLoc();
  const IRIntegers &a = host.arithmetic();

  int64_t vectorWidth =
      std::max(whole->second.vectorWidth, partial->second.vectorWidth);
  if (clustered)
    vectorWidth = std::max(vectorWidth, clustered->second.vectorWidth);
  SourceOpArguments arguments =
      forwardArguments(host, op, vectorWidth, whole->second.name);
  Value tokens = arguments.tokens, tokens64 = arguments.tokens64;
  llvm::StringMap<Value> &values = arguments.values;
  MemRefType sourceType = op.getSourceType();
  int64_t elementBytes = bytesOf(sourceType.getElementType());
  int64_t L = op.getNumSourceValues(), D = op.getWidth();
  Value mergedRows = a.mul(a.constant(op.getNumQueries()), tokens64);
  // The kernels' grid symbols: the tokens, and the merge's [M?, T...] rows.
  llvm::StringMap<Value> walkSymbols = {{"N", tokens}};
  llvm::StringMap<Value> mergeSymbols = {{"rows", host.toIndex(mergedRows)}};
  values["num_rows"] = mergedRows;
  values["rows_per_weight"] = tokens64;
  llvm::StringSet<> madeHere = {"sources", "partial_o", "partial_lse"};
  for (const auto *kernel : {whole, partial, merge, clustered})
    if (kernel)
      host.checkArguments(kernel->second, values, madeHere);

  // The split over sources, as the bundle runtime chooses it: P partitions
  // by LaunchRules.h's rule from the device's occupancy of the partial
  // kernel; the clustered kernel with the most partitions up to P (or up to
  // its own rule's count, clusteredForwardPartitions, where that is more)
  // whose clusters (one a block of rows) all fit on the device at once;
  // else, with P > 1, the partial kernel and the merge over a workspace;
  // else the kernel that walks all sources.
  int64_t rowsPerBlock = integerFact(facts, "rows_per_block");
  const ::attnres::launch::Rules &rules = ::attnres::launch::kDefaultRules;
  int64_t fixed = counts.forwardPartitions;
  int64_t rowBytes = L * D * elementBytes;
  // The clustered kernel may take more partitions than the partial one:
  // rows too short for the partial kernel's merge (never with a fixed
  // count, which both take as given).
  bool clusterBeyondSplit =
      clustered && fixed == 0 &&
      ::attnres::launch::clusteredPartitionLimit(L, rules) >
          ::attnres::launch::forwardPartitionLimit(L, rowBytes, rules);
  // Sources too few or rows too short ever to split (or one partition
  // asked for): the whole kernel.
  values["num_partitions"] = a.constant(1);
  if (fixed == 1 ||
      (fixed == 0 && !clusterBeyondSplit &&
       ::attnres::launch::forwardPartitionLimit(L, rowBytes, rules) == 1)) {
    if (failed(host.launch(whole->first, whole->second, values, walkSymbols)))
      return failure();
    host.finish();
    return success();
  }
  Value resident = fixed ? Value() : host.residentBlocks(partial->second);
  // The blocks of rows of one partition of the walk, and the clustered
  // kernel's clusters (ceil(N / 1) is N).
  Value tokenBlocks = rowsPerBlock == 1
                          ? tokens64
                          : a.ceilDiv(tokens64, a.constant(rowsPerBlock));
  Value partitions = fixed ? a.constant(fixed)
                           : ::attnres::launch::forwardPartitions(
                                 a, resident, tokenBlocks, L, rowBytes, rules);
  Value clusterUpTo = partitions;
  if (clusterBeyondSplit)
    clusterUpTo =
        a.max(partitions, ::attnres::launch::clusteredForwardPartitions(
                              a, resident, tokenBlocks, L, rules));
  Value split = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sgt,
                                      clusterUpTo, a.constant(1));
  auto ifSplit = scf::IfOp::create(b, loc, split, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPoint(ifSplit.elseBlock()->getTerminator());
    if (failed(host.launch(whole->first, whole->second, values, walkSymbols)))
      return failure();

    b.setInsertionPoint(ifSplit.thenBlock()->getTerminator());
    Value clusterPartitions = a.constant(0);
    // A fixed count is clustered only as asked, as the runtime does with a
    // count given to a call.
    for (int64_t p = fixed ? fixed : 2;
         clustered && p <= std::min(L, ::attnres::launch::kMaxClusterBlocks) &&
         (!fixed || p == fixed);
         ++p) {
      Value capacity = host.clusterCapacity(clustered->second, p);
      // One statement an op: the order of a call's arguments is the C++
      // compiler's, and the IR must not depend on it.
      Value allFit = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sle,
                                           tokenBlocks, capacity);
      Value withinCount = arith::CmpIOp::create(
          b, loc, arith::CmpIPredicate::sle, a.constant(p), clusterUpTo);
      Value fits = arith::AndIOp::create(b, loc, withinCount, allFit);
      clusterPartitions = arith::SelectOp::create(b, loc, fits, a.constant(p),
                                                  clusterPartitions);
    }
    Value useCluster = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge,
                                             clusterPartitions, a.constant(2));
    auto ifCluster =
        scf::IfOp::create(b, loc, useCluster, /*withElseRegion=*/true);
    if (clustered) {
      b.setInsertionPoint(ifCluster.thenBlock()->getTerminator());
      values["num_partitions"] = clusterPartitions;
      if (failed(host.launch(
              clustered->first, clustered->second, values,
              {{"N", tokens}, {"P", host.toIndex(clusterPartitions)}})))
        return failure();
    }

    b.setInsertionPoint(ifCluster.elseBlock()->getTerminator());
    if (clusterBeyondSplit) {
      // No cluster fits, and the partial kernel's rule may keep the rows
      // whole.
      auto ifPartial = scf::IfOp::create(
          b, loc,
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sgt, partitions,
                                a.constant(1)),
          /*withElseRegion=*/true);
      b.setInsertionPoint(ifPartial.elseBlock()->getTerminator());
      values["num_partitions"] = a.constant(1);
      if (failed(host.launch(whole->first, whole->second, values, walkSymbols)))
        return failure();
      b.setInsertionPoint(ifPartial.thenBlock()->getTerminator());
    }
    values["num_partitions"] = partitions;
    auto layout = ::attnres::launch::forwardWorkspace(
        a, a.mul(partitions, mergedRows), D);
    Value workspace =
        host.allocate(MemRefType::get({ShapedType::kDynamic}, b.getI8Type()),
                      {host.toIndex(layout.bytes)});
    Value base = host.addressOf(workspace);
    values["partial_o"] = base;
    values["partial_lse"] = a.add(base, layout.lseOffset);
    llvm::StringMap<Value> partialSymbols = walkSymbols;
    partialSymbols["P"] = host.toIndex(partitions);
    if (failed(host.launch(partial->first, partial->second, values,
                           partialSymbols)))
      return failure();
    if (failed(host.launch(merge->first, merge->second, values, mergeSymbols)))
      return failure();
    gpu::DeallocOp::create(b, loc, /*asyncToken=*/Type(), ValueRange(),
                           workspace);
  }
  host.finish();
  return success();
}

LogicalResult replaceBackward(BackwardIntoOp op, DictionaryAttr facts,
                              const RecordedKernels &kernels,
                              const LaunchCounts &counts, unsigned &refusals) {
  const auto *backward = kernelOf(op, facts, "backward", kernels);
  const auto *finalize = kernelOf(op, facts, "finalize", kernels);
  if (!backward || !finalize)
    return failure();
  const KernelInfo &info = backward->second;
  HostLauncher host(op, refusals);
  OpBuilder &b = host.builder();
  const IRIntegers &a = host.arithmetic();

  SourceOpArguments arguments =
      backwardArguments(host, op, info.vectorWidth, info.name);
  Value tokens = arguments.tokens, tokens64 = arguments.tokens64;
  llvm::StringMap<Value> &values = arguments.values;
  int64_t L = op.getNumSourceValues();

  // Blocks B and source partitions P by the runtime's rules, from the
  // device's occupancy of the backward kernel; the workspace of their
  // partial rows.
  int64_t rowsPerBlock = integerFact(facts, "rows_per_block");
  int64_t partialRowsPerBlock = integerFact(facts, "partial_rows_per_block");
  const ::attnres::launch::Rules &rules = ::attnres::launch::kDefaultRules;
  Value resident = host.residentBlocks(info);
  Value blocks = ::attnres::launch::backwardBlocks(
      a, resident, tokens64, rowsPerBlock * rules.tokensPerBlock);
  Value partitions = counts.backwardPartitions
                         ? a.constant(counts.backwardPartitions)
                         : ::attnres::launch::backwardPartitions(
                               a, resident, blocks, L, rules);
  Value partialRows =
      a.mul(a.mul(partitions, blocks), a.constant(partialRowsPerBlock));
  int64_t M = op.getNumQueries(), R = op.getRank(), D = op.getWidth();
  bool perQueryNorm =
      op.getOutputNormWeight() &&
      cast<MemRefType>(op.getOutputNormWeight().getType()).getRank() == 2;
  auto layout = ::attnres::launch::backwardWorkspace(
      a, partialRows, M * R,
      op.getOutputNormWeight() ? (perQueryNorm ? M : 1) * D : 0);
  Value workspace = host.allocateTemporary(
      MemRefType::get({ShapedType::kDynamic}, b.getI8Type()),
      {host.toIndex(layout.bytes)});
  Value base = host.addressOf(workspace);
  values["partial_da"] = base;
  values["partial_dh"] = a.add(base, layout.dhOffset);
  values["num_blocks"] = blocks;
  values["num_partitions"] = partitions;
  values["num_partial_rows"] = partialRows;

  llvm::StringSet<> madeHere = {"sources", "grad_sources", "partial_da",
                                "partial_dh"};
  host.checkArguments(info, values, madeHere);
  host.checkArguments(finalize->second, values, madeHere);
  llvm::StringMap<Value> symbols = {{"N", tokens},
                                    {"B", host.toIndex(blocks)},
                                    {"P", host.toIndex(partitions)}};
  if (failed(host.launch(backward->first, info, values, symbols)) ||
      failed(host.launch(finalize->first, finalize->second, values, symbols)))
    return failure();
  host.finish();
  return success();
}

LogicalResult replacePartitionReduce(PartitionReduceIntoOp op,
                                     DictionaryAttr facts,
                                     const RecordedKernels &kernels,
                                     unsigned &refusals) {
  bool sum = op.getKind() == ReduceKind::Sum;
  const auto *kernel = kernelOf(op, facts, sum ? "sum" : "merge", kernels);
  if (!kernel)
    return failure();
  HostLauncher host(op, refusals);
  OpBuilder &b = host.builder();
  Location loc = op.getLoc();
  Value partials = op.getPartials();
  llvm::StringMap<Value> values, symbols;
  if (sum) {
    // The output is the partials' [S...] without their leading P.
    Value o = op.getOutputBuffer();
    Value elements = host.index(1);
    for (int64_t dim = 0; dim < cast<MemRefType>(o.getType()).getRank(); ++dim)
      elements = arith::MulIOp::create(
          b, loc, elements, memref::DimOp::create(b, loc, partials, dim + 1));
    Value elements64 = host.toI64(elements);
    host.bindAddresses(values, {{"partials", partials}, {"output", o}});
    values["num_elements"] = elements64;
    symbols = {{"N", elements}, {"rows", elements}};
  } else {
    MergeArguments arguments = mergeArguments(host, op, kernel->second.name);
    values = std::move(arguments.values);
    symbols = {{"N", arguments.rows}, {"rows", arguments.rows}};
  }
  // Every buffer is the op's own operand or result.
  host.checkArguments(kernel->second, values, /*madeHere=*/{});
  if (failed(host.launch(kernel->first, kernel->second, values, symbols)))
    return failure();
  host.finish();
  return success();
}

} // namespace

namespace {

/// Replaces an attnres op by host code that runs it with its kernels (named
/// by role in `facts`, the op's manifest entry): a forward launches its
/// kernels on P partitions of the sources (unsplit, clustered, or partial +
/// merge); a backward its kernel on B x P blocks and its finalize (the
/// runtime's rules at run time; P from `counts` where fixed); a
/// partition_reduce its merge
/// or sum. `refusals` numbers the messages of the alignment checks across
/// the module's ops.
LogicalResult replaceByLaunches(Operation *op, DictionaryAttr facts,
                                const RecordedKernels &kernels,
                                const LaunchCounts &counts,
                                unsigned &refusals) {
  if (auto forward = dyn_cast<ForwardIntoOp>(op))
    return replaceForward(forward, facts, kernels, counts, refusals);
  if (auto backward = dyn_cast<BackwardIntoOp>(op))
    return replaceBackward(backward, facts, kernels, counts, refusals);
  return replacePartitionReduce(cast<PartitionReduceIntoOp>(op), facts, kernels,
                                refusals);
}

/// Checks what attnres-launch-kernels takes from an op's attnres.launch
/// attribute (hand-written IR is input too): the sizes it computes with
/// present where it
/// needs them, in the schema's ranges and, where the op states them, equal
/// to the op's own; fixed counts and tiles whole numbers of blocks. The
/// counts go to `counts`.
LogicalResult validateLaunch(Operation *op, DictionaryAttr launch,
                             LaunchCounts &counts) {
  auto fail = [&](const Twine &message) {
    return op->emitError() << "attnres-launch-kernels: " << message;
  };
  for (const auto &field : ::attnres::manifest::kOpFacts) {
    Attribute fact = launch.get(field.key);
    if (!fact)
      continue;
    std::optional<int64_t> value = integerValue(fact);
    if (!value || *value < field.min || *value > field.max)
      return fail(Twine(field.key) + " must be an integer in [" +
                  Twine(field.min) + ", " + Twine(field.max) + "]");
  }
  auto require = [&](StringRef name,
                     std::optional<int64_t> expected = {}) -> LogicalResult {
    std::optional<int64_t> value = integerValue(launch.get(name));
    if (!value)
      return fail("the op's attnres.launch needs '" + name + "'");
    if (expected && *value != *expected)
      return fail(name + " = " + Twine(*value) + " is not the op's " +
                  Twine(*expected));
    return success();
  };
  auto sourceFacts = [&](auto sourceOp) {
    return success(
        succeeded(require("num_sources", sourceOp.getNumSourceValues())) &&
        succeeded(require("width", sourceOp.getWidth())) &&
        succeeded(require("rank", sourceOp.getRank())) &&
        succeeded(require("num_queries", sourceOp.getNumQueries())) &&
        succeeded(require("rows_per_block")));
  };
  int64_t sources = 0; // L, of a forward or backward
  if (auto forward = dyn_cast<ForwardIntoOp>(op)) {
    sources = forward.getNumSourceValues();
    if (failed(sourceFacts(forward)))
      return failure();
  } else if (auto backward = dyn_cast<BackwardIntoOp>(op)) {
    sources = backward.getNumSourceValues();
    if (failed(sourceFacts(backward)) ||
        failed(require("partial_rows_per_block")))
      return failure();
  } else {
    auto reduce = cast<PartitionReduceIntoOp>(op);
    if (failed(require("num_partitions", reduce.getNumPartitions())) ||
        (reduce.getKind() == ReduceKind::Softmax &&
         failed(require("rows_per_block"))))
      return failure();
  }
  auto count = [&](StringRef name, int64_t &out) -> LogicalResult {
    Attribute fact = launch.get(name);
    if (!fact)
      return success();
    std::optional<int64_t> value = integerValue(fact);
    if (!value || *value < 1 || *value > kMaxGridBlocks)
      return fail(name + " must be a count in [1, " + Twine(kMaxGridBlocks) +
                  "] (absent: the runtime's rule)");
    out = *value;
    return success();
  };
  if (failed(count("forward_partitions", counts.forwardPartitions)) ||
      failed(count("backward_partitions", counts.backwardPartitions)))
    return failure();
  // Partitions of the sources: at most one a source.
  for (auto [name, partitions] :
       {std::pair<StringRef, int64_t>{"forward_partitions",
                                      counts.forwardPartitions},
        {"backward_partitions", counts.backwardPartitions}})
    if (sources && partitions > sources)
      return fail(name + " = " + Twine(partitions) + " is more than the op's " +
                  Twine(sources) + " sources");
  return success();
}

/// An attnres op of `module` that the pass launches: at the top level of a
/// function of the module, and on buffers.
LogicalResult checkPlacement(ModuleOp module, Operation *op) {
  auto function = dyn_cast<func::FuncOp>(op->getParentOp());
  if (!function || function->getParentOp() != module) {
    InFlightDiagnostic diagnostic =
        op->emitError() << "attnres-launch-kernels: keep-host=1 launches "
                           "attnres ops at the top level of a function of "
                           "the module it runs on; this one is ";
    if (function)
      return diagnostic << "in a function of a nested module";
    return diagnostic << "inside '" << op->getParentOp()->getName() << "'";
  }
  // The launches write buffers; the ops on tensors are bufferized first.
  if (!isOpOnBuffers(op))
    return op->emitError()
           << "attnres-launch-kernels launches the attnres ops on buffers "
              "(attnres.forward_into, ...); bufferize this op first "
              "(attnres-bufferize-host)";
  // Its kernels take a buffer's address and the op's sizes: the rows of
  // every buffer must lie one after the other from its first element (a
  // buffer, or consecutive rows of one: a partial forward's piece of the
  // stack its merge reads).
  for (auto [index, operand] : llvm::enumerate(op->getOperands()))
    if (isa<MemRefType>(operand.getType()) && !isDenseView(operand))
      return op->emitError()
             << "attnres-launch-kernels launches the kernels of whole "
                "buffers, whose elements lie one after the other (an "
                "identity layout, or consecutive rows of such a buffer); "
                "operand #"
             << index << " is " << operand.getType();
  return success();
}

/// The symbols the host code adds to the module: the runtime's functions
/// with their types, and the prefixes of its global strings. A symbol of
/// the module by one of those names but not the same declaration is an
/// error, not a redefinition the verifier finds after the pass.
LogicalResult checkRuntimeSymbols(ModuleOp module) {
  for (Operation &op : module.getBody()->getOperations()) {
    auto symbol =
        op.getAttrOfType<StringAttr>(SymbolTable::getSymbolAttrName());
    if (!symbol)
      continue;
    if (symbol.getValue().starts_with("attnres_kernel_name_") ||
        symbol.getValue().starts_with("attnres_refusal_"))
      return op.emitError() << "attnres-launch-kernels: the symbol names of "
                               "the host code's strings (attnres_kernel_name_"
                               "*, attnres_refusal_*) are its own; the module "
                               "has @"
                            << symbol.getValue();
    for (const RuntimeFunction &runtime : kRuntimeFunctions) {
      if (symbol.getValue() != runtime.name)
        continue;
      FunctionType type = runtime.type(module.getContext());
      auto function = dyn_cast<func::FuncOp>(op);
      if (!function || function.getFunctionType() != type)
        return op.emitError() << "attnres-launch-kernels: @" << runtime.name
                              << " is the runtime's function of type " << type
                              << " (attnres-c/GpuWrappers.h)";
    }
  }
  return success();
}

struct LaunchKernelsPass
    : mlir::attnres::impl::AttnResLaunchKernelsBase<LaunchKernelsPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The kernels as the module describes them: what the bundle manifest
    // is written from, read back. A description names its own gpu.func,
    // once in the module: the runtime finds a kernel by that name.
    RecordedKernels kernels;
    bool described = true;
    module.walk([&](gpu::GPUFuncOp func) {
      if (!described || !func->hasAttr("attnres.kernel"))
        return;
      FailureOr<KernelInfo> info = readKernelDescription(func);
      if (failed(info)) {
        described = false;
        return;
      }
      std::string name = info->name;
      if (name != func.getName() || kernels.count(name)) {
        func.emitError() << "attnres-launch-kernels: the kernel's "
                            "description names '"
                         << name
                         << "', which must be its own name and name no "
                            "other kernel of the module";
        described = false;
        return;
      }
      kernels[name] = {func, std::move(*info)};
    });
    if (!described || failed(checkRuntimeSymbols(module)))
      return signalPassFailure();
    SmallVector<std::pair<Operation *, LaunchCounts>> ops;
    bool annotated = true;
    module.walk([&](Operation *op) {
      if (!annotated || !(isOpOnBuffers(op) ||
                          isa<ForwardOp, BackwardOp, PartitionReduceOp>(op)))
        return;
      // A forward's, backward's or softmax merge's tile loop runs as a grid of
      // its own (attnres-lower-tiles-to-gpu).
      if (auto loop = dyn_cast<scf::ForallOp>(op->getParentOp());
          loop && isOpOnBuffers(op) && isLoweredTileOp(op) &&
          !op->hasAttr(kLaunchAttrName) &&
          isa<func::FuncOp>(loop->getParentOp()))
        return;
      if (failed(checkPlacement(module, op))) {
        annotated = false;
        return;
      }
      auto launch = op->getAttrOfType<DictionaryAttr>(kLaunchAttrName);
      if (!launch) {
        op->emitError() << "attnres-launch-kernels: the op names no kernels "
                           "(its '"
                        << kLaunchAttrName
                        << "' attribute, which convert-attnres-to-gpu with "
                           "keep-host=1 gives it)";
        annotated = false;
        return;
      }
      LaunchCounts counts;
      if (failed(validateLaunch(op, launch, counts))) {
        annotated = false;
        return;
      }
      ops.emplace_back(op, counts);
    });
    if (!annotated)
      return signalPassFailure();
    // gpu.launch_func names kernels of the module's own gpu.modules.
    if (!ops.empty())
      module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                      UnitAttr::get(module.getContext()));
    unsigned refusals = 0;
    for (auto [op, counts] : ops) {
      auto launch = op->getAttrOfType<DictionaryAttr>(kLaunchAttrName);
      if (failed(replaceByLaunches(op, launch, kernels, counts, refusals)))
        return signalPassFailure();
    }
  }
};

} // namespace
