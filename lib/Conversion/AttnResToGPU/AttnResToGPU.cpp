//===- AttnResToGPU.cpp - attnres ops to GPU kernels ----------------------===//

#include "Kernels.h"

#include "attnres/Conversion/Passes.h"
#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace mlir::attnres {
#define GEN_PASS_DEF_CONVERTATTNRESTOGPU
#include "attnres/Conversion/Passes.h.inc"
} // namespace mlir::attnres

using namespace mlir;
using namespace mlir::attnres;
using namespace mlir::attnres::gpu_kernels;

namespace {

Type elementOf(Value value) {
  return value ? getElementTypeOrSelf(value.getType()) : Type();
}

/// The description of a kernel as an attribute of its gpu.func.
DictionaryAttr describe(Builder &b, const KernelInfo &info) {
  SmallVector<Attribute> arguments;
  for (const auto &argument : info.arguments) {
    NamedAttrList entry;
    entry.append("name", b.getStringAttr(argument.name));
    entry.append("kind", b.getStringAttr(argument.kind));
    entry.append("type", b.getStringAttr(argument.type));
    entry.append("shape", b.getStringAttr(argument.shape));
    if (argument.alignment > 0)
      entry.append("alignment", b.getI64IntegerAttr(argument.alignment));
    arguments.push_back(entry.getDictionary(b.getContext()));
  }
  SmallVector<Attribute> grid;
  for (const GridDimension &dim : info.grid)
    grid.push_back(b.getDictionaryAttr({
        b.getNamedAttr("symbol", b.getStringAttr(dim.symbol)),
        b.getNamedAttr("scale", b.getI64IntegerAttr(dim.scale)),
        b.getNamedAttr("divisor", b.getI64IntegerAttr(dim.divisor)),
    }));
  NamedAttrList description;
  description.append("name", b.getStringAttr(info.name));
  description.append("role", b.getStringAttr(info.role));
  description.append("arguments", b.getArrayAttr(arguments));
  description.append("grid", b.getArrayAttr(grid));
  description.append("block", b.getI64IntegerAttr(info.block));
  description.append("workgroup_bytes",
                     b.getI64IntegerAttr(info.workgroupBytes));
  description.append("vector_width", b.getI64IntegerAttr(info.vectorWidth));
  // Stated only where it holds: the manifests of other kernels stay as
  // they were.
  if (info.clusterY)
    description.append(::attnres::manifest::kKernelClusterY,
                       b.getBoolAttr(true));
  return description.getDictionary(b.getContext());
}

} // namespace

std::optional<int64_t> gpu_kernels::integerValue(Attribute attribute) {
  auto integer = dyn_cast_or_null<IntegerAttr>(attribute);
  if (!integer)
    return std::nullopt;
  auto type = dyn_cast<IntegerType>(integer.getType());
  if (!type || !type.isSignless() || type.getWidth() > 64)
    return std::nullopt;
  return integer.getInt();
}

FailureOr<KernelInfo> gpu_kernels::readKernelDescription(gpu::GPUFuncOp func) {
  namespace schema = ::attnres::manifest;
  auto description = func->getAttrOfType<DictionaryAttr>("attnres.kernel");
  auto malformed = [&](const Twine &what) {
    return func.emitError()
           << "the kernel's attnres.kernel description " << what;
  };
  if (!description)
    return malformed("is missing");
  auto text = [&](DictionaryAttr dict, StringRef key,
                  std::string &out) -> LogicalResult {
    auto value = dict.getAs<StringAttr>(key);
    if (!value)
      return malformed("has no string '" + key + "'");
    out = value.str();
    return success();
  };
  // A number in the range the manifest's schema (and so the runtime)
  // allows; an optional one may be absent.
  auto number = [&](DictionaryAttr dict, schema::NumberField field,
                    int64_t &out, bool optional = false) -> LogicalResult {
    Attribute attribute = dict.get(field.key);
    if (!attribute && optional)
      return success();
    std::optional<int64_t> value = integerValue(attribute);
    if (!value)
      return malformed("has no integer '" + Twine(field.key) + "'");
    if (*value < field.min || *value > field.max)
      return malformed("has '" + Twine(field.key) + "' = " + Twine(*value) +
                       ", outside [" + Twine(field.min) + ", " +
                       Twine(field.max) + "]");
    out = *value;
    return success();
  };
  KernelInfo info;
  auto arguments = description.getAs<ArrayAttr>("arguments");
  auto grid = description.getAs<ArrayAttr>("grid");
  std::optional<int64_t> workgroupBytes =
      integerValue(description.get("workgroup_bytes"));
  if (!arguments || !grid || grid.size() != 3 || !workgroupBytes)
    return malformed("needs 'arguments', a 'grid' of three dimensions and "
                     "'workgroup_bytes'");
  info.workgroupBytes = *workgroupBytes;
  if (failed(text(description, "name", info.name)) ||
      failed(text(description, "role", info.role)) ||
      failed(number(description, schema::kKernelBlock, info.block)) ||
      failed(number(description, schema::kKernelVectorWidth, info.vectorWidth)))
    return failure();
  if (arguments.size() != func.getNumArguments())
    return malformed("lists " + Twine(arguments.size()) + " arguments of " +
                     Twine(func.getNumArguments()));
  for (Attribute entry : arguments) {
    auto dict = dyn_cast<DictionaryAttr>(entry);
    if (!dict)
      return malformed("has an argument that is not a dictionary");
    auto &argument = info.arguments.emplace_back();
    if (failed(text(dict, "name", argument.name)) ||
        failed(text(dict, "kind", argument.kind)) ||
        failed(text(dict, "type", argument.type)) ||
        failed(text(dict, "shape", argument.shape)) ||
        failed(number(dict, schema::kArgumentAlignment, argument.alignment,
                      /*optional=*/true)))
      return failure();
    if (argument.kind != "buffer" && argument.kind != "table" &&
        argument.kind != "i64")
      return malformed("has argument '" + argument.name + "' of kind '" +
                       argument.kind + "' (buffer, table or i64)");
    if (argument.alignment && !schema::isPowerOfTwo(argument.alignment))
      return malformed("has argument '" + argument.name + "' aligned to " +
                       Twine(argument.alignment) +
                       " bytes, not a power of two");
  }
  for (auto [index, entry] : llvm::enumerate(grid)) {
    auto dict = dyn_cast<DictionaryAttr>(entry);
    if (!dict)
      return malformed("has a grid dimension that is not a dictionary");
    GridDimension &dim = info.grid[index];
    if (failed(text(dict, "symbol", dim.symbol)) ||
        failed(number(dict, schema::kGridScale, dim.scale)) ||
        failed(number(dict, schema::kGridDivisor, dim.divisor)))
      return failure();
  }
  if (auto clusterY = description.getAs<BoolAttr>(schema::kKernelClusterY))
    info.clusterY = clusterY.getValue();
  return info;
}

bool gpu_kernels::isIndexArithmetic(Operation *op) {
  auto isIndexLike = [](Type type) { return type.isIntOrIndex(); };
  return isMemoryEffectFree(op) && op->getNumRegions() == 0 &&
         llvm::all_of(op->getOperandTypes(), isIndexLike) &&
         llvm::all_of(op->getResultTypes(), isIndexLike);
}

bool gpu_kernels::isLoweredTileOp(Operation *op) {
  if (auto merge = dyn_cast<PartitionReduceOp>(op))
    return merge.getKind() == ReduceKind::Softmax;
  if (auto merge = dyn_cast<PartitionReduceIntoOp>(op))
    return merge.getKind() == ReduceKind::Softmax;
  return isa<ForwardOp, ForwardIntoOp, BackwardOp, BackwardIntoOp>(op);
}

/// Whether `loop` is a tile loop of one forward, backward or merge that runs as
/// a grid of blocks (attnres-lower-tiles-to-gpu), with the first op of its body
/// that cannot run there: the op, slices of tensors, sizes and index
/// arithmetic.
static Operation *firstOffTileLoop(scf::ForallOp loop) {
  int tiled = 0;
  for (Operation &op : loop.getBody()->without_terminator()) {
    if (isLoweredTileOp(&op) && ++tiled == 1)
      continue;
    if (isa<tensor::ExtractSliceOp, tensor::DimOp>(op) ||
        isIndexArithmetic(&op))
      continue;
    return &op;
  }
  return tiled == 1 ? nullptr : loop.getOperation();
}

/// Whether `loop` has the form of a tile loop around a forward, backward or
/// merge: at the top level of a function, its outputs each written by one
/// result of the op of its body (a tile of it) and nothing else, every result
/// written.
static bool writesTilesOfItsOp(scf::ForallOp loop) {
  if (!isa<func::FuncOp>(loop->getParentOp()) || loop.getNumResults() == 0)
    return false;
  auto ops = llvm::make_filter_range(
      loop.getBody()->without_terminator(),
      [](Operation &op) { return isLoweredTileOp(&op); });
  if (ops.empty())
    return false;
  Operation *tiled = &*ops.begin();
  auto inserts = loop.getTerminator().getYieldingOps();
  if (static_cast<size_t>(llvm::range_size(inserts)) != tiled->getNumResults())
    return false;
  return llvm::all_of(inserts, [&](Operation &op) {
    auto insert = dyn_cast<tensor::ParallelInsertSliceOp>(op);
    return insert && insert.getSource().getDefiningOp() == tiled &&
           insert.getSource().hasOneUse();
  });
}

std::string gpu_kernels::tileLoopMismatch(scf::ForallOp loop) {
  if (!isa<func::FuncOp>(loop->getParentOp()))
    return "the loop is not at the top level of a function";
  if (Operation *off = firstOffTileLoop(loop))
    return off == loop.getOperation()
               ? "its body holds no forward, backward or softmax merge"
               : ("its body holds '" + off->getName().getStringRef() +
                  "', which a tile's thread code does not run (only the op, "
                  "slices of tensors, sizes and index arithmetic)")
                     .str();
  if (!writesTilesOfItsOp(loop))
    return "the loop's outputs are not its op's results, each written once";
  return "";
}

bool gpu_kernels::isLoweredTileLoop(scf::ForallOp loop) {
  return tileLoopMismatch(loop).empty();
}

/// Whether `size` is all of dimension `dim` of `source` (a tensor or a
/// buffer): its static size, a tensor.dim or memref.dim of it, or the size
/// it was made with (tensor.empty, an allocation).
static bool isWholeDim(OpFoldResult size, Value source, int64_t dim) {
  auto type = cast<ShapedType>(source.getType());
  if (!type.isDynamicDim(dim)) {
    std::optional<int64_t> known = getConstantIntValue(size);
    return known && *known == type.getDimSize(dim);
  }
  auto value = dyn_cast<Value>(size);
  if (!value)
    return false;
  auto readOf = [&](auto read) {
    std::optional<int64_t> index = getConstantIntValue(read.getIndex());
    return read.getSource() == source && index && *index == dim;
  };
  if (auto read = value.getDefiningOp<tensor::DimOp>(); read && readOf(read))
    return true;
  if (auto read = value.getDefiningOp<memref::DimOp>(); read && readOf(read))
    return true;
  return madeWithSize(source, dim) == value;
}

Value gpu_kernels::madeWithSize(Value value, int64_t dim) {
  auto type = cast<ShapedType>(value.getType());
  if (!type.isDynamicDim(dim))
    return {};
  ValueRange sizes;
  if (auto empty = value.getDefiningOp<tensor::EmptyOp>())
    sizes = empty.getDynamicSizes();
  else if (auto alloc = value.getDefiningOp<gpu::AllocOp>())
    sizes = alloc.getDynamicSizes();
  else if (auto alloc = value.getDefiningOp<memref::AllocOp>())
    sizes = alloc.getDynamicSizes();
  else
    return {};
  return sizes[type.getDynamicDimIndex(dim)];
}

bool gpu_kernels::isConsecutiveRows(OffsetSizeAndStrideOpInterface slice,
                                    Value source) {
  if (!llvm::all_of(slice.getMixedStrides(),
                    [](OpFoldResult stride) { return isOneInteger(stride); }))
    return false;
  SmallVector<OpFoldResult> offsets = slice.getMixedOffsets(),
                            sizes = slice.getMixedSizes();
  // Unit dimensions, then one cut anywhere, then whole dimensions.
  size_t cut = 0;
  while (cut < sizes.size() && isOneInteger(sizes[cut]))
    ++cut;
  for (size_t dim = cut + 1; dim < sizes.size(); ++dim)
    if (!isZeroInteger(offsets[dim]) || !isWholeDim(sizes[dim], source, dim))
      return false;
  return true;
}

bool gpu_kernels::isDenseView(Value buffer) {
  auto type = dyn_cast<MemRefType>(buffer.getType());
  if (!type)
    return false;
  if (type.getLayout().isIdentity())
    return true;
  if (auto subview = buffer.getDefiningOp<memref::SubViewOp>())
    return isDenseView(subview.getSource()) &&
           isConsecutiveRows(subview, subview.getSource());
  if (auto collapse = buffer.getDefiningOp<memref::CollapseShapeOp>())
    return isDenseView(collapse.getSrc());
  if (auto expand = buffer.getDefiningOp<memref::ExpandShapeOp>())
    return isDenseView(expand.getSrc());
  return false;
}

Value gpu_kernels::stackedPiece(Value stacked) {
  auto expand = stacked.getDefiningOp<tensor::ExpandShapeOp>();
  if (!expand)
    return {};
  SmallVector<int64_t> shape{1};
  llvm::append_range(shape, expand.getSrcType().getShape());
  if (expand.getResultType().getShape() != ArrayRef<int64_t>(shape))
    return {};
  return expand.getSrc();
}

SmallVector<Value> gpu_kernels::stackedPieces(tensor::ConcatOp concat) {
  if (concat.getDim() != 0)
    return {};
  SmallVector<Value> pieces;
  for (Value input : concat.getInputs()) {
    Value piece = stackedPiece(input);
    if (!piece)
      return {};
    pieces.push_back(piece);
  }
  return pieces;
}

LogicalResult gpu_kernels::checkKeptFunction(func::FuncOp function,
                                             StringRef pass) {
  auto isTensor = [](Type type) { return isa<TensorType>(type); };
  // A forward's, backward's or merge's tile loop runs on the device as a whole
  // (one block a tile), checked as such once its body has been walked past.
  auto tileLoopOf = [&](Operation *op) -> scf::ForallOp {
    auto loop = dyn_cast<scf::ForallOp>(op);
    if (!loop || loop->getParentOp() != function || !writesTilesOfItsOp(loop))
      return {};
    return loop;
  };
  WalkResult result = function.walk([&](Operation *op) {
    for (Operation *parent = op->getParentOp(); parent && parent != function;
         parent = parent->getParentOp())
      if (tileLoopOf(parent))
        return WalkResult::advance();
    if (scf::ForallOp loop = tileLoopOf(op)) {
      if (Operation *off = firstOffTileLoop(loop)) {
        off->emitError()
            << pass
            << ": keep-host=1 runs a tile loop of a forward, backward or "
               "merge as a grid of blocks, whose body may hold one "
               "attnres.forward, attnres.backward or softmax "
               "attnres.partition_reduce, slices of tensors and index "
               "arithmetic; '"
            << off->getName() << "' is none of them";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    }
    // A tile loop's outputs, before its tiles are written into them.
    if (isa<tensor::EmptyOp>(op) && !op->use_empty() &&
        llvm::all_of(op->getUsers(),
                     [](Operation *user) { return isa<scf::ForallOp>(user); }))
      return WalkResult::advance();
    if (isa<ForwardOp, BackwardOp, PartitionReduceOp>(op)) {
      if (op->getParentOp() == function)
        return WalkResult::advance();
      op->emitError() << pass
                      << ": keep-host=1 launches "
                         "attnres ops at the top level of a function; this "
                         "one is inside '"
                      << op->getParentOp()->getName()
                      << "' (the loops of attnres-split-reduction and "
                         "attnres-tile are launched as their kernels' "
                         "blocks; no other region is)";
      return WalkResult::interrupt();
    }
    if (isa<func::ReturnOp>(op) ||
        (!llvm::any_of(op->getOperandTypes(), isTensor) &&
         !llvm::any_of(op->getResultTypes(), isTensor)))
      return WalkResult::advance();
    // tensor.dim reads a size from the descriptor, not the data; the
    // reshapes and slices become views of the same buffer
    // (attnres-split-reduction merges several token dimensions into one;
    // attnres-split-sources slices packed sources); attnres-bufferize-host
    // makes a stack of pieces (attnres-split-sources' partial results)
    // a buffer that the pieces are written into.
    if (isa<tensor::DimOp, tensor::CollapseShapeOp, tensor::ExpandShapeOp>(op))
      return WalkResult::advance();
    if (auto slice = dyn_cast<tensor::ExtractSliceOp>(op);
        slice && isConsecutiveRows(slice, slice.getSource()))
      return WalkResult::advance();
    if (auto concat = dyn_cast<tensor::ConcatOp>(op);
        concat && !stackedPieces(concat).empty())
      return WalkResult::advance();
    op->emitError()
        << pass
        << ": keep-host=1 keeps every "
           "tensor in device memory, which only attnres ops, "
           "tensor.dim, reshapes, slices of consecutive rows and stacks "
           "(a tensor.concat of unit-dimension expansions) may use; '"
        << op->getName()
        << "' is none of them (keep-host=0 compiles the attnres ops "
           "alone)";
    return WalkResult::interrupt();
  });
  return failure(result.wasInterrupted());
}

Value gpu_kernels::allocateOnDevice(OpBuilder &b, Location loc, MemRefType type,
                                    ValueRange dynamicSizes) {
  return gpu::AllocOp::create(b, loc, type, /*asyncToken=*/Type(),
                              /*asyncDependencies=*/ValueRange(), dynamicSizes,
                              /*symbolOperands=*/ValueRange(),
                              /*hostShared=*/false)
      .getMemref();
}

namespace {

template <typename OpT> AttnResSpec commonSpec(OpT op) {
  AttnResSpec spec;
  spec.numSources = op.getNumSourceValues();
  spec.width = op.getWidth();
  spec.rank = op.getRank();
  spec.numQueries = op.getNumQueries();
  spec.value = op.getSourceType().getElementType();
  spec.query = elementOf(op.getQuery());
  spec.keyNorm = elementOf(op.getKeyNormWeight());
  spec.outputNorm = elementOf(op.getOutputNormWeight());
  spec.perQueryOutputNorm =
      op.getOutputNormWeight() &&
      cast<ShapedType>(op.getOutputNormWeight().getType()).getRank() == 2;
  spec.eps = op.getEps().convertToDouble();
  spec.scale = op.getScale().convertToDouble();
  return spec;
}

} // namespace

AttnResSpec gpu_kernels::forwardSpec(Operation *op) {
  auto of = [](auto forward, Value output, Value oPre, Value residual) {
    AttnResSpec spec = commonSpec(forward);
    spec.output = getElementTypeOrSelf(output.getType());
    spec.writeOPre = static_cast<bool>(oPre);
    spec.writeResidual = static_cast<bool>(residual);
    return spec;
  };
  if (auto forward = dyn_cast<ForwardIntoOp>(op))
    return of(forward, forward.getOutputBuffer(), forward.getOPreBuffer(),
              forward.getOPreResidualBuffer());
  auto forward = cast<ForwardOp>(op);
  return of(forward, forward.getOutput(), forward.getOPre(),
            forward.getOPreResidual());
}

AttnResSpec gpu_kernels::backwardSpec(Operation *op) {
  auto of = [](auto backward, Value gradQuery, Value gradKeyNorm,
               Value gradOutputNorm, bool accumulate) {
    AttnResSpec spec = commonSpec(backward);
    spec.grad = elementOf(backward.getGradOutput());
    spec.saved = elementOf(backward.getSavedOutput());
    spec.readResidual = static_cast<bool>(backward.getSavedResidual());
    spec.readGradLse = static_cast<bool>(backward.getGradLse());
    spec.accumulate = accumulate;
    spec.gradQuery = elementOf(gradQuery);
    spec.gradKeyNorm = elementOf(gradKeyNorm);
    spec.gradOutputNorm = elementOf(gradOutputNorm);
    return spec;
  };
  if (auto backward = dyn_cast<BackwardIntoOp>(op))
    return of(backward, backward.getGradQueryBuffer(),
              backward.getGradKeyNormWeightBuffer(),
              backward.getGradOutputNormWeightBuffer(),
              backward.getAccumulate());
  auto backward = cast<BackwardOp>(op);
  return of(backward, backward.getGradQuery(), backward.getGradKeyNormWeight(),
            backward.getGradOutputNormWeight(),
            !backward.getAccumulated().empty());
}

MergeSpec gpu_kernels::mergeSpec(Operation *op, int64_t loadsInFlight) {
  auto of = [&](auto merge, Value output, Value oPre, Value residual) {
    MergeSpec spec;
    auto outputType = cast<ShapedType>(output.getType());
    spec.width = outputType.getShape().back();
    spec.output = outputType.getElementType();
    Value weight = merge.getOutputNormWeight();
    spec.outputNorm = elementOf(weight);
    spec.perRowGroupWeight =
        weight && cast<ShapedType>(weight.getType()).getRank() == 2;
    spec.sink = static_cast<bool>(merge.getSink());
    spec.staticPartitions = merge.getNumPartitions();
    spec.writeOPre = static_cast<bool>(oPre);
    spec.writeResidual = static_cast<bool>(residual);
    if (loadsInFlight > 0)
      spec.loadsInFlight = loadsInFlight;
    spec.eps = merge.getEps().convertToDouble();
    return spec;
  };
  if (auto merge = dyn_cast<PartitionReduceIntoOp>(op))
    return of(merge, merge.getOutputBuffer(), merge.getOPreBuffer(),
              merge.getOPreResidualBuffer());
  auto merge = cast<PartitionReduceOp>(op);
  return of(merge, merge.getOutput(), merge.getOPre(), merge.getOPreResidual());
}

namespace {

/// What the manifest records of an op, next to its kernels.
NamedAttrList opFacts(Builder &b, StringRef kind, const AttnResSpec &spec) {
  NamedAttrList facts;
  facts.append("op", b.getStringAttr(kind));
  facts.append("num_sources", b.getI64IntegerAttr(spec.numSources));
  facts.append("width", b.getI64IntegerAttr(spec.width));
  facts.append("rank", b.getI64IntegerAttr(spec.rank));
  facts.append("num_queries", b.getI64IntegerAttr(spec.numQueries));
  facts.append("value_type", b.getStringAttr(typeName(spec.value)));
  facts.append("query_type", b.getStringAttr(typeName(spec.query)));
  if (spec.keyNorm)
    facts.append("key_norm_type", b.getStringAttr(typeName(spec.keyNorm)));
  if (spec.outputNorm) {
    facts.append("output_norm_type",
                 b.getStringAttr(typeName(spec.outputNorm)));
    facts.append("output_norm_per_query",
                 b.getBoolAttr(spec.perQueryOutputNorm));
  }
  facts.append("eps", b.getF64FloatAttr(spec.eps));
  facts.append("scale", b.getF64FloatAttr(spec.scale));
  return facts;
}

struct ConvertAttnResToGPUPass
    : mlir::attnres::impl::ConvertAttnResToGPUBase<ConvertAttnResToGPUPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    OpBuilder b(module.getContext());
    Location loc = module.getLoc();
    if (failed(refuseOpsOnBuffers(module, getArgument())))
      return signalPassFailure();
    if (subgroupSize < 1 || !llvm::isPowerOf2_64(subgroupSize) ||
        maxBlockThreads < subgroupSize) {
      emitError(loc) << "convert-attnres-to-gpu: subgroup-size must be a "
                        "power of two no larger than max-block-threads";
      return signalPassFailure();
    }
    if (reductionThreads < 0 || reductionThreads > maxBlockThreads) {
      emitError(loc) << "convert-attnres-to-gpu: reduction-threads must be 0 "
                        "(chosen) or at most max-block-threads ("
                     << int64_t(maxBlockThreads) << "), got "
                     << int64_t(reductionThreads);
      return signalPassFailure();
    }
    if (forwardMinBlocks < -1 || backwardMinBlocks < -1 ||
        forwardMinBlocks > 32 || backwardMinBlocks > 32) {
      emitError(loc) << "convert-attnres-to-gpu: forward-min-blocks and "
                        "backward-min-blocks must be in [-1, 32]";
      return signalPassFailure();
    }
    if (forwardSourceBatch < 0 || backwardSourceBatch < 0 ||
        unrollSources < 0 || mergeTileColumns < 0 || mergeLoadsInFlight < 0) {
      emitError(loc) << "convert-attnres-to-gpu: forward-source-batch, "
                        "backward-source-batch, unroll-sources, "
                        "merge-tile-columns and merge-loads-in-flight must "
                        "be >= 0";
      return signalPassFailure();
    }
    if (forwardStagedBatches < 0 || forwardStagedBatches > 8 ||
        backwardStagedBatches < -1 || backwardStagedBatches > 8) {
      emitError(loc) << "convert-attnres-to-gpu: forward-staged-batches must "
                        "be in [0, 8] and backward-staged-batches in [-1, 8]";
      return signalPassFailure();
    }
    if (clusters && subgroupSize != 32) {
      emitError(loc) << "convert-attnres-to-gpu: clusters=1 is NVIDIA's "
                        "(sm_90 and later; subgroup-size 32)";
      return signalPassFailure();
    }
    if ((forwardStagedBatches > 0 || backwardStagedBatches > 0) &&
        !asyncCopies) {
      emitError(loc) << "convert-attnres-to-gpu: staged batches need "
                        "asynchronous copies (async-copies=1: NVIDIA sm_80 "
                        "and later)";
      return signalPassFailure();
    }

    if (backwardPartitions < 0) {
      emitError(loc) << "convert-attnres-to-gpu: backward-partitions must be "
                        ">= 0 (0: the runtime's rule)";
      return signalPassFailure();
    }
    if (!keepHost && backwardPartitions) {
      emitError(loc) << "convert-attnres-to-gpu: backward-partitions fixes "
                        "the launches of keep-host=1; a bundle's launches "
                        "take it per call (the runtime's "
                        "AttnresBackwardArgs)";
      return signalPassFailure();
    }
    // The split passes' decompositions run as the kernels that implement
    // them, on the grid they state (keep-host); a bundle's ops are launched
    // whole by the runtime, which picks their blocks per call.
    // Tile loops stay loops (attnres-lower-tiles-to-gpu makes them grids).
    llvm::DenseMap<Operation *, int64_t> splitPartitions;
    if (keepHost)
      completeTileLoops(module);
    if (failed(checkTileLoops(module, keepHost)) ||
        (keepHost && failed(absorbSplitForwards(module, splitPartitions))))
      return signalPassFailure();
    if (keepHost && backwardPartitions > 1) {
      // A split backward's tiles each walk every source of their tokens.
      WalkResult split = module.walk([&](BackwardOp op) {
        auto loop = dyn_cast<scf::ForallOp>(op->getParentOp());
        if (!loop)
          return WalkResult::advance();
        loop.emitError() << "convert-attnres-to-gpu: backward-partitions "
                            "splits the sources of a backward launched "
                            "whole; this one is attnres-split-reduction's "
                            "loop, whose blocks each walk every source of "
                            "their tokens";
        return WalkResult::interrupt();
      });
      if (split.wasInterrupted())
        return signalPassFailure();
    }
    if (keepHost) {
      bool hostOnly = true;
      for (auto function : module.getOps<func::FuncOp>())
        hostOnly &= succeeded(checkKeptFunction(function, getArgument()));
      if (!hostOnly)
        return signalPassFailure();
    }

    b.setInsertionPointToEnd(module.getBody());
    auto kernels = gpu::GPUModuleOp::create(b, loc, "attnres_kernels");
    b.setInsertionPointToStart(&kernels.getBodyRegion().front());
    SmallVector<Attribute> ops;
    SmallVector<func::FuncOp> functions;
    SmallVector<std::pair<Operation *, DictionaryAttr>> launches;
    bool ok = true;
    for (auto function : module.getOps<func::FuncOp>()) {
      functions.push_back(function);
      int index = 0;
      function.walk([&](Operation *op) {
        // The forwards, backwards and merges of the tile loops that remain
        // run as grids of their own (attnres-lower-tiles-to-gpu).
        if (keepHost && isa<scf::ForallOp>(op->getParentOp()))
          return;
        std::string prefix = (function.getSymName() + "_" + Twine(index)).str();
        std::optional<DictionaryAttr> facts;
        if (auto forward = dyn_cast<ForwardOp>(op))
          facts = convertForward(b, forward, prefix);
        else if (auto backward = dyn_cast<BackwardOp>(op))
          facts = convertBackward(b, backward, prefix);
        else if (auto reduce = dyn_cast<PartitionReduceOp>(op))
          facts = convertPartitionReduce(b, reduce, prefix);
        else
          return;
        if (!*facts) {
          ok = false;
          return;
        }
        NamedAttrList entry(*facts);
        entry.append("function", b.getStringAttr(function.getSymName()));
        entry.append("index", b.getI64IntegerAttr(index));
        ops.push_back(entry.getDictionary(b.getContext()));
        ++index;
        if (keepHost)
          launches.emplace_back(op, *facts);
      });
    }
    if (!ok || kernelTooLarge)
      return signalPassFailure();
    if (ops.empty()) {
      // Tile loops of forwards, backwards and merges are
      // attnres-lower-tiles-to-gpu's.
      bool tileLoops = false;
      module.walk(
          [&](scf::ForallOp loop) { tileLoops |= isLoweredTileLoop(loop); });
      if (!keepHost || !tileLoops) {
        emitError(loc) << "convert-attnres-to-gpu: the module has no attnres "
                          "op to compile";
        return signalPassFailure();
      }
      kernels.erase();
    }
    if (!ops.empty())
      kernels->setAttr("attnres.ops", b.getArrayAttr(ops));
    if (keepHost) {
      // The functions stay, each op naming its kernels and the counts the
      // IR fixed, which attnres-launch-kernels launches them with.
      for (auto [op, facts] : launches) {
        NamedAttrList launch(facts);
        auto fixed = [&](StringRef name, int64_t count) {
          if (count)
            launch.append(name, b.getI64IntegerAttr(count));
        };
        fixed("forward_partitions", splitPartitions.lookup(op));
        if (auto backward = dyn_cast<BackwardOp>(op)) {
          int64_t sources = backward.getNumSourceValues();
          if (backwardPartitions > sources) {
            backward.emitError()
                << "convert-attnres-to-gpu: backward-partitions = "
                << int64_t(backwardPartitions) << " is more than the op's "
                << sources << " sources";
            return signalPassFailure();
          }
          fixed("backward_partitions", backwardPartitions);
        }
        op->setAttr(kLaunchAttrName, launch.getDictionary(b.getContext()));
      }
    } else {
      // The host side is the runtime's (see the manifest).
      for (func::FuncOp function : functions)
        function.erase();
    }
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    b.getUnitAttr());
  }

  /// The choices the options make (KernelChoices.cpp).
  KernelChoices choices() const {
    return KernelChoices{
        subgroupSize,         maxBlockThreads,       unrollSources,
        forwardThreadsPerRow, forwardSourceBatch,    forwardPrefetch,
        forwardStagedBatches, backwardThreadsPerRow, backwardSourceBatch,
        backwardPrefetch,     backwardStagedBatches, asyncCopies};
  }
  FailureOr<RowLayout> layoutFor(Operation *op, int64_t width,
                                 ArrayRef<Type> streamed, int64_t lanes,
                                 int64_t heldRows = 0, bool forward = false) {
    return choices().layoutFor(op, getArgument(), width, streamed, lanes,
                               heldRows, forward);
  }
  SourceSchedule scheduleFor(int64_t batch, bool prefetch, int64_t numSources,
                             int64_t stagedBatches) {
    return choices().scheduleFor(batch, prefetch, numSources, stagedBatches);
  }

  /// Records a kernel on its gpu.func and returns its name.
  StringAttr record(OpBuilder &b, KernelInfo info) {
    // The kernel builders leave the insertion point right after the kernel.
    auto func = cast<gpu::GPUFuncOp>(&*std::prev(b.getInsertionPoint()));
    func->setAttr("attnres.kernel", describe(b, info));
    if (info.workgroupBytes > kMaxWorkgroupBytes) {
      func.emitError() << "convert-attnres-to-gpu: kernel " << info.name
                       << " needs " << info.workgroupBytes
                       << " bytes of workgroup memory, more than the "
                       << kMaxWorkgroupBytes
                       << " a block may declare (fewer staged batches)";
      kernelTooLarge = true;
    }
    lastKernel = func;
    return b.getStringAttr(info.name);
  }

  gpu::GPUFuncOp lastKernel;
  bool kernelTooLarge = false;

  /// A register budget for ptxas on the kernel just recorded: `asked`
  /// blocks must fit on a multiprocessor at once; -1 chooses, when
  /// `automatic`, 512 threads a multiprocessor (128 registers a thread).
  /// NVIDIA only; AMD's backend sizes its waves itself.
  void setMinBlocks(int64_t asked, bool automatic, const RowLayout &layout) {
    if (subgroupSize != 32)
      return;
    int64_t blocks = asked;
    if (asked < 0)
      blocks = automatic ? 512 / layout.blockThreads() : 0;
    if (blocks > 0)
      lastKernel->setAttr("nvvm.minctasm",
                          OpBuilder(lastKernel).getI32IntegerAttr(blocks));
  }

  /// Tiles a merge row of `width` columns splits into: the largest count
  /// whose tiles are at least merge-tile-columns wide (512 by default) and a
  /// multiple of 8 columns (whole 16-byte vectors of bf16, an even width for
  /// the residual).
  int64_t mergeColumnTiles(int64_t width) const {
    int64_t columns = mergeTileColumns > 0 ? mergeTileColumns : 512;
    int64_t best = 1;
    for (int64_t tiles = 2; width / tiles >= columns; ++tiles)
      if (width % tiles == 0 && (width / tiles) % 8 == 0)
        best = tiles;
    return best;
  }

  DictionaryAttr convertForward(OpBuilder &b, ForwardOp op,
                                const std::string &prefix) {
    AttnResSpec spec = forwardSpec(op);
    FailureOr<RowLayout> layoutOr =
        choices().forwardLayout(op, getArgument(), spec);
    if (failed(layoutOr))
      return {};
    RowLayout layout = *layoutOr;
    SourceSchedule schedule = choices().forwardSchedule(spec, layout);
    // The split over sources runs when there are few rows: every block's
    // loads must then be in flight, prefetching included.
    SourceSchedule partialSchedule =
        scheduleFor(choices().forwardBatch(layout), forwardPrefetch != 0,
                    spec.numSources,
                    choices().forwardStaging(layout, spec.value));
    Location loc = op.getLoc();
    NamedAttrList facts = opFacts(b, "forward", spec);
    facts.append("output_type", b.getStringAttr(typeName(spec.output)));
    facts.append("writes_o_pre", b.getBoolAttr(spec.writeOPre));
    facts.append("writes_o_pre_residual", b.getBoolAttr(spec.writeResidual));
    facts.append("rows_per_block", b.getI64IntegerAttr(layout.rowsPerBlock));
    facts.append("vector_width", b.getI64IntegerAttr(layout.vectorWidth));
    facts.append("threads_per_row", b.getI64IntegerAttr(layout.threadsPerRow));
    facts.append("source_batch", b.getI64IntegerAttr(schedule.batch));
    facts.append(
        "forward",
        record(b, emitForwardKernel(b, loc, prefix + "_forward", spec, layout,
                                    schedule, ForwardKind::Whole)));
    // The forward holds 128 registers a thread (four blocks of 128 threads
    // a multiprocessor) except with an output norm, where ptxas took 130,
    // and in blocks of 256 threads or more, where ptxas took 130 at
    // (L, D) = (64, 8192) without a key norm: one block a multiprocessor
    // instead of two, 0.62 of the floor against 0.90. (Asking four blocks
    // of 128 threads where ptxas already lands at 128 makes it spill.)
    setMinBlocks(forwardMinBlocks,
                 spec.numQueries == 1 &&
                     (spec.outputNorm || layout.blockThreads() >= 256),
                 layout);
    facts.append("forward_partial",
                 record(b, emitForwardKernel(
                               b, loc, prefix + "_forward_partial", spec,
                               layout, partialSchedule, ForwardKind::Partial)));
    // The split forward merged in the cluster of a row's blocks: where the
    // partial rows of a block's rows fit next to the walk's workgroup data.
    // The runtime uses it where all clusters of a launch (one a block of
    // rows) fit on the device at once, so registers decide which P it can
    // take.
    // Blocks of 256 threads or more walk without prefetching and are held
    // to two blocks a multiprocessor (128 registers: all 16 clusters of 8 at
    // (32, 16, 8192) fit on the H200, 10.1 us; prefetching at 183
    // registers, 15 fit, so P = 6, 11.5 us); smaller blocks prefetch
    // (168 registers at (64, 128, 4096): P = 2, 26.1 us, against 29.0 us
    // without: docs/Performance.md).
    bool wideBlocks = layout.blockThreads() >= 256;
    SourceSchedule clusterSchedule = wideBlocks ? schedule : partialSchedule;
    if (clusters && spec.width % 4 == 0 &&
        forwardWorkgroupBytes(b, loc, spec, layout, clusterSchedule,
                              ForwardKind::ClusterMerged) <=
            kMaxWorkgroupBytes) {
      facts.append(
          "forward_cluster",
          record(b, emitForwardKernel(b, loc, prefix + "_forward_cluster", spec,
                                      layout, clusterSchedule,
                                      ForwardKind::ClusterMerged)));
      setMinBlocks(forwardMinBlocks, wideBlocks, layout);
    }
    MergeSpec merge;
    merge.width = spec.width;
    merge.output = spec.output;
    merge.outputNorm = spec.outputNorm;
    merge.perRowGroupWeight = spec.perQueryOutputNorm;
    merge.writeOPre = spec.writeOPre;
    merge.writeResidual = spec.writeResidual;
    merge.eps = spec.eps;
    if (!spec.outputNorm)
      merge.columnTiles = mergeColumnTiles(spec.width);
    if (mergeLoadsInFlight > 0)
      merge.loadsInFlight = mergeLoadsInFlight;
    FailureOr<RowLayout> mergeLayoutOr = layoutFor(
        op, spec.width / merge.columnTiles, {b.getF32Type(), spec.output}, 0);
    if (failed(mergeLayoutOr))
      return {};
    RowLayout mergeLayout = *mergeLayoutOr;
    facts.append("merge", record(b, emitMergeKernel(b, loc, prefix + "_merge",
                                                    merge, mergeLayout)));
    facts.append("merge_rows_per_block",
                 b.getI64IntegerAttr(mergeLayout.rowsPerBlock));
    return facts.getDictionary(b.getContext());
  }

  DictionaryAttr convertBackward(OpBuilder &b, BackwardOp op,
                                 const std::string &prefix) {
    AttnResSpec spec = backwardSpec(op);
    spec.writeTags = writeTags;
    FailureOr<RowLayout> layoutOr =
        choices().backwardLayout(op, getArgument(), spec);
    if (failed(layoutOr))
      return {};
    RowLayout layout = *layoutOr;
    SourceSchedule schedule = choices().backwardSchedule(spec, layout);
    Location loc = op.getLoc();
    NamedAttrList facts = opFacts(b, "backward", spec);
    facts.append("grad_type", b.getStringAttr(typeName(spec.grad)));
    if (spec.saved)
      facts.append("saved_type", b.getStringAttr(typeName(spec.saved)));
    facts.append("reads_saved_residual", b.getBoolAttr(spec.readResidual));
    if (spec.readGradLse)
      facts.append("reads_grad_lse", b.getBoolAttr(true));
    // The source gradients' rows are read and added to, not overwritten.
    if (spec.accumulate)
      facts.append("accumulates", b.getBoolAttr(true));
    // A null entry of the table of source gradients asks for no gradient of
    // that source: its row is neither read nor written. Bundles without
    // this fact store through every entry, so a caller passes nulls only
    // where it is there.
    facts.append("skips_null_gradients", b.getBoolAttr(true));
    // With write-tags, an entry with bit 0 set is that row's address plus
    // one: the backward writes the row (an accumulating one without reading
    // it). Bundles without this fact would store at the odd address.
    if (spec.writeTags)
      facts.append("writes_tagged_gradients", b.getBoolAttr(true));
    facts.append("rows_per_block", b.getI64IntegerAttr(layout.rowsPerBlock));
    // Whether the backward adds its row groups' partial rows before writing
    // them (bundles without this fact wrote one per row group).
    facts.append(
        "partial_rows_per_block",
        b.getI64IntegerAttr(backwardPartialRowsPerBlock(spec, layout)));
    facts.append("vector_width", b.getI64IntegerAttr(layout.vectorWidth));
    facts.append("threads_per_row", b.getI64IntegerAttr(layout.threadsPerRow));
    facts.append("source_batch", b.getI64IntegerAttr(schedule.batch));
    facts.append("backward",
                 record(b, emitBackwardKernel(b, loc, prefix + "_backward",
                                              spec, layout, schedule)));
    // A thread holding at most two vectors of each of its rows fits in 128
    // registers (ptxas otherwise takes up to 172 with an output norm at
    // D = 4096: one block of 256 threads a multiprocessor instead of two).
    setMinBlocks(backwardMinBlocks, layout.chunks <= 2 && spec.numQueries == 1,
                 layout);
    facts.append("finalize",
                 record(b, emitFinalizeKernel(b, loc, prefix + "_finalize",
                                              spec, reductionThreads,
                                              subgroupSize, maxBlockThreads)));
    return facts.getDictionary(b.getContext());
  }

  DictionaryAttr convertPartitionReduce(OpBuilder &b, PartitionReduceOp op,
                                        const std::string &prefix) {
    Location loc = op.getLoc();
    NamedAttrList facts;
    auto outputType = op.getOutput().getType();
    facts.append("num_partitions", b.getI64IntegerAttr(op.getNumPartitions()));
    facts.append("output_type",
                 b.getStringAttr(typeName(outputType.getElementType())));
    if (op.getKind() == ReduceKind::Sum) {
      facts.append("op", b.getStringAttr("partition_reduce_sum"));
      facts.append(
          "sum", record(b, emitSumKernel(
                               b, loc, prefix + "_sum", op.getNumPartitions(),
                               outputType.getElementType(),
                               reductionThreads > 0 ? reductionThreads : 256)));
      return facts.getDictionary(b.getContext());
    }
    MergeSpec merge = mergeSpec(op, mergeLoadsInFlight);
    FailureOr<RowLayout> layoutOr =
        choices().mergeLayout(op, getArgument(), merge.width, merge.output);
    if (failed(layoutOr))
      return {};
    RowLayout layout = *layoutOr;
    facts.append("op", b.getStringAttr("partition_reduce_softmax"));
    facts.append("width", b.getI64IntegerAttr(merge.width));
    facts.append("has_sink", b.getBoolAttr(merge.sink));
    facts.append("rows_per_block", b.getI64IntegerAttr(layout.rowsPerBlock));
    facts.append("merge", record(b, emitMergeKernel(b, loc, prefix + "_merge",
                                                    merge, layout)));
    return facts.getDictionary(b.getContext());
  }
};

} // namespace
