//===- Kernels.cpp - the attnres GPU kernels ------------------------------===//
//
// Every kernel that reads the sources walks them in batches (SourceWalker):
// the rows of a batch are loaded together, the next batch prefetched, and
// one row sum reduces the key norms and dot products of the whole batch.
//
// forward:  an online softmax per query over the batches: the running
//           maximum, weight sum and FP32 output rows are rescaled once per
//           batch and updated in registers.
// partial:  the same over the sources of partition blockIdx.y, writing FP32
//           partial outputs and their lse for the merge.
// merge:    the softmax merge of P partial rows (empty partitions skipped,
//           optional sink), with the optional output norm.
// backward: blocks of tokens (blockIdx.x) by partitions of the sources
//           (blockIdx.y); per row, delta = <do_pre, o_pre> first (from the
//           saved o_pre, or recomputed), then one walk over the partition's
//           sources that writes dv and accumulates the query and output-norm
//           gradients in registers, stored once per block as FP32 partial
//           rows.
// finalize: the partial rows summed in a fixed order: dq, dg, dh.
// sum:      partition_reduce sum.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "attnres/Bundle/LaunchRules.h"
#include "attnres/Dialect/AttnRes/Utils/Residual.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;
using ::attnres::launch::kMaxClusterBlocks;

std::string mlir::attnres::gpu_kernels::typeName(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

void mlir::attnres::gpu_kernels::recordAlignments(Operation *scope,
                                                  ArrayRef<Value> arguments,
                                                  KernelInfo &info) {
  llvm::SmallDenseMap<Value, unsigned> argumentIndex;
  for (auto [index, argument] : llvm::enumerate(arguments))
    argumentIndex.try_emplace(argument, index);
  SmallVector<int64_t> widest(arguments.size(), 1);
  auto note = [&](Value address, int64_t alignment) {
    SmallVector<Value> pending{address};
    llvm::SmallPtrSet<Value, 8> seen;
    while (!pending.empty()) {
      Value value = pending.pop_back_val();
      if (!seen.insert(value).second)
        continue;
      if (auto found = argumentIndex.find(value);
          found != argumentIndex.end()) {
        int64_t &slot = widest[found->second];
        slot = std::max(slot, alignment);
      } else if (auto gep = value.getDefiningOp<LLVM::GEPOp>()) {
        pending.push_back(gep.getBase());
      } else if (auto select = value.getDefiningOp<arith::SelectOp>()) {
        pending.append({select.getTrueValue(), select.getFalseValue()});
      } else if (auto select = value.getDefiningOp<LLVM::SelectOp>()) {
        pending.append({select.getTrueValue(), select.getFalseValue()});
      } else if (auto argument = dyn_cast<BlockArgument>(value)) {
        if (auto loop =
                dyn_cast<scf::ForOp>(argument.getOwner()->getParentOp())) {
          if (OpOperand *init = loop.getTiedLoopInit(argument))
            pending.push_back(init->get());
          if (OpOperand *yielded = loop.getTiedLoopYieldedValue(argument))
            pending.push_back(yielded->get());
        }
      }
    }
  };
  scope->walk([&](Operation *op) {
    if (auto load = dyn_cast<LLVM::LoadOp>(op))
      note(load.getAddr(), load.getAlignment().value_or(1));
    else if (auto store = dyn_cast<LLVM::StoreOp>(op))
      note(store.getAddr(), store.getAlignment().value_or(1));
    else if (auto copy = dyn_cast<NVVM::CpAsyncOp>(op))
      note(copy.getSrc(), copy.getSize());
  });
  for (auto [index, argument] : llvm::enumerate(info.arguments))
    if (argument.kind != "i64")
      argument.alignment = widest[index];
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A kernel under construction: its arguments, declared by name, and its
/// body: a gpu.func of its own, or the body of a gpu.launch (`into`) whose
/// host values stand for the arguments.
class KernelBuilder {
public:
  KernelBuilder(OpBuilder &b, Location loc, StringRef name, StringRef role,
                const LaunchBody *into = nullptr)
      : b(b), loc(loc), into(into) {
    info.name = name.str();
    info.role = role.str();
  }

  /// Declares a buffer argument and returns its index.
  unsigned buffer(StringRef name, Type element, StringRef shape) {
    info.arguments.push_back(
        {name.str(), "buffer", typeName(element), shape.str()});
    types.push_back(LLVM::LLVMPointerType::get(b.getContext(), 1));
    return types.size() - 1;
  }
  unsigned table(StringRef name, Type element, StringRef shape) {
    info.arguments.push_back(
        {name.str(), "table", typeName(element), shape.str()});
    types.push_back(LLVM::LLVMPointerType::get(b.getContext(), 1));
    return types.size() - 1;
  }
  unsigned scalar(StringRef name) {
    info.arguments.push_back({name.str(), "i64", "i64", ""});
    types.push_back(b.getI64Type());
    return types.size() - 1;
  }

  /// Starts the body with a workgroup buffer of `workgroupFloats` floats
  /// and leaves `b` in it: a new gpu.func, or the launch of `into`, sized
  /// for the kernel.
  void begin(int64_t blockThreads, int64_t workgroupFloats) {
    info.block = blockThreads;
    info.workgroupBytes = workgroupFloats * 4;
    auto workgroupType = MemRefType::get(
        {workgroupFloats}, b.getF32Type(), MemRefLayoutAttrInterface(),
        gpu::AddressSpaceAttr::get(b.getContext(),
                                   gpu::AddressSpace::Workgroup));
    if (into) {
      beginLaunch(blockThreads, workgroupType);
      return;
    }
    func =
        gpu::GPUFuncOp::create(b, loc, info.name, b.getFunctionType(types, {}),
                               TypeRange{workgroupType});
    func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
    // Row sums are read back, and staged rows copied and read, 16 bytes at
    // a time.
    func.setWorkgroupAttributionAttr(0, LLVM::LLVMDialect::getAlignAttrName(),
                                     b.getI64IntegerAttr(16));
    func.setKnownBlockSizeAttr(
        b.getDenseI32ArrayAttr({static_cast<int32_t>(blockThreads), 1, 1}));
    b.setInsertionPointToStart(&func.getBody().front());
    llvm::append_range(arguments, func.getArguments());
    workgroupBuffer = func.getWorkgroupAttributions().front();
  }
  Value arg(unsigned index) { return arguments[index]; }
  Value workgroup() { return workgroupBuffer; }
  KernelInfo finish() {
    if (into) {
      recordAlignments(into->launch, arguments, info);
      return info;
    }
    gpu::ReturnOp::create(b, loc);
    b.setInsertionPointAfter(func);
    recordAlignments(func, arguments, info);
    return info;
  }

  OpBuilder &b;
  Location loc;
  KernelInfo info;

private:
  /// The launch's block and workgroup memory are the kernel's; its
  /// arguments are the host's values, addresses becoming global pointers.
  /// The workgroup buffer is the launch's dynamic workgroup memory (an
  /// outlined kernel's workgroup attributions lose their alignment): NVVM's
  /// lowering aligns it to 16 bytes, the bytes the row sums and staged rows
  /// are read with; on AMD it starts the kernel's LDS, which holds nothing
  /// else.
  void beginLaunch(int64_t blockThreads, MemRefType workgroupType) {
    gpu::LaunchOp launch = into->launch;
    b.setInsertionPoint(launch);
    launch.getBlockSizeXMutable().assign(
        arith::ConstantIndexOp::create(b, loc, blockThreads));
    launch.getDynamicSharedMemorySizeMutable().assign(
        arith::ConstantIntOp::create(b, loc, b.getI32Type(),
                                     info.workgroupBytes));
    b.setInsertionPoint(into->at);
    Value bytes = gpu::DynamicSharedMemoryOp::create(
        b, loc,
        MemRefType::get({ShapedType::kDynamic}, b.getI8Type(),
                        MemRefLayoutAttrInterface(),
                        workgroupType.getMemorySpace()));
    workgroupBuffer = memref::ViewOp::create(
        b, loc, workgroupType, bytes, arith::ConstantIndexOp::create(b, loc, 0),
        ValueRange());
    for (auto [argument, type] : llvm::zip_equal(info.arguments, types)) {
      Value value = into->arguments.lookup(argument.name);
      assert(value && "the host binds every argument of the kernel");
      if (isa<LLVM::LLVMPointerType>(type))
        value = LLVM::IntToPtrOp::create(b, loc, type, value);
      arguments.push_back(value);
    }
  }

  const LaunchBody *into;
  SmallVector<Type> types;
  SmallVector<Value> arguments;
  Value workgroupBuffer;
  gpu::GPUFuncOp func;
};

/// Whether the query and key norm weight are read as whole vectors, like
/// the source rows: the key is the whole row (R = D) and a vector of them
/// is no wider than a source vector, so the row buffers' alignment (which
/// the runtime checks for "[.., D]" buffers) covers them. Scalar loads cost
/// each block a few hundred instructions and a chain of L2 round trips
/// before its first row sum (the forward with a key norm measured 3-4 %
/// slower than without at N = 8192).
bool vectorQueryLoads(const AttnResSpec &spec) {
  auto narrowEnough = [&](Type type) {
    return !type ||
           type.getIntOrFloatBitWidth() <= spec.value.getIntOrFloatBitWidth();
  };
  return spec.rank == spec.width && narrowEnough(spec.query) &&
         narrowEnough(spec.keyNorm);
}

/// The query's and key norm weight's kernel arguments: "[M, D]" / "[D]"
/// (vector-aligned row buffers) when read as vectors.
unsigned queryBuffer(KernelBuilder &k, const AttnResSpec &spec) {
  return k.buffer("query", spec.query,
                  vectorQueryLoads(spec) ? "[M, D]" : "[M, R]");
}
int keyNormBuffer(KernelBuilder &k, const AttnResSpec &spec) {
  if (!spec.keyNorm)
    return -1;
  return k.buffer("key_norm", spec.keyNorm,
                  vectorQueryLoads(spec) ? "[D]" : "[R]");
}

/// `a[m][c]`: the chunk vectors of g * q[m] laid over the key coordinates of
/// a row (zero elsewhere); without a key norm weight, q[m]. `query` may be
/// any [rows, R] buffer of `element`s read as the query is (the key norm
/// weight, as one row).
SmallVector<SmallVector<Value>>
keyQuery(KernelEmitter &e, const AttnResSpec &spec, Value query, Value keyNorm,
         ArrayRef<Value> keyMasks, Type element = {}, int64_t rows = 0) {
  OpBuilder &b = e.b;
  int64_t width = e.layout.vectorWidth;
  int64_t keyStart = spec.width - spec.rank;
  if (!element) {
    element = spec.query;
    rows = spec.numQueries;
  }
  SmallVector<SmallVector<Value>> a(rows);
  if (vectorQueryLoads(spec)) {
    for (int64_t c = 0; c < e.layout.chunks; ++c) {
      Value start = e.mulI(e.vectorIndex[c], e.constI64(width));
      Value weight =
          keyNorm ? e.loadVector(keyNorm, start, spec.keyNorm) : Value();
      for (int64_t m = 0; m < rows; ++m) {
        Value vector = e.loadVector(
            query, e.addI(e.constI64(m * spec.width), start), element);
        if (weight)
          vector = e.mul(vector, weight);
        a[m].push_back(e.select(keyMasks[c], vector, e.zeroVector()));
      }
    }
    return a;
  }
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    SmallVector<Value> coordinates;
    for (int64_t j = 0; j < width; ++j) {
      Value d = vector::ExtractOp::create(b, e.loc, e.elementIndex[c],
                                          ArrayRef<int64_t>{j});
      Value r = arith::MaxSIOp::create(
          b, e.loc, arith::SubIOp::create(b, e.loc, d, e.constI64(keyStart)),
          e.constI64(0));
      coordinates.push_back(r);
    }
    for (int64_t m = 0; m < rows; ++m) {
      Value vector = e.zeroVector();
      for (int64_t j = 0; j < width; ++j) {
        Value r = coordinates[j];
        Value value =
            e.loadScalar(query, e.addI(e.constI64(m * spec.rank), r), element);
        if (keyNorm)
          value = e.mul(value, e.loadScalar(keyNorm, r, spec.keyNorm));
        vector = vector::InsertOp::create(b, e.loc, value, vector,
                                          ArrayRef<int64_t>{j});
      }
      a[m].push_back(e.select(keyMasks[c], vector, e.zeroVector()));
    }
  }
  return a;
}

/// The chunk vectors of row `row` (i64) of the [rows, D] buffer at `base`,
/// zero outside the row.
SmallVector<Value> loadRow(KernelEmitter &e, Value base, Value row,
                           Type element) {
  SmallVector<Value> chunks;
  Value rowStart = e.mulI(row, e.constI64(e.layout.width));
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    Value index = e.addI(
        rowStart, e.mulI(e.vectorIndex[c], e.constI64(e.layout.vectorWidth)));
    Value loaded = e.loadVector(base, index, element);
    chunks.push_back(e.select(e.chunkActive[c], loaded, e.zeroVector()));
  }
  return chunks;
}

/// Byte index of chunk c's residuals in a residual buffer ([rows, D/2] i8):
/// a chunk of `vectorWidth` (even) elements has `vectorWidth / 2` bytes.
Value residualIndex(KernelEmitter &e, Value row, int64_t c) {
  return e.addI(e.mulI(row, e.constI64(e.layout.width / 2)),
                e.mulI(e.vectorIndex[c], e.constI64(e.layout.vectorWidth / 2)));
}

/// The shuffle mask taking every other element of a vector of `width`,
/// starting at `first`.
SmallVector<int64_t> everyOther(int64_t width, int64_t first) {
  SmallVector<int64_t> mask;
  for (int64_t j = first; j < width; j += 2)
    mask.push_back(j);
  return mask;
}

/// Stores the FP32 vector `chunk` rounded to the 16-bit `element` at element
/// `index` of `base`, and the residuals of the rounding at byte
/// `residualByte` of `residualBase` (two 4-bit residuals a byte).
void storeWithResidual(KernelEmitter &e, Value chunk, Value base, Value index,
                       Type element, Value residualBase, Value residualByte) {
  auto vectorType = cast<VectorType>(chunk.getType());
  int64_t width = vectorType.getNumElements();
  Value narrow =
      LLVM::FPTruncOp::create(e.b, e.loc, vectorType.clone(element), chunk);
  e.storeVectorRaw(narrow, base, index);
  Value rounded = LLVM::FPExtOp::create(e.b, e.loc, vectorType, narrow);
  Value nibbles = mlir::attnres::residual::encode(
      e.b, e.loc, chunk, rounded,
      mlir::attnres::residual::fractionBits(element));
  Value even = vector::ShuffleOp::create(e.b, e.loc, nibbles, nibbles,
                                         everyOther(width, 0));
  Value odd = vector::ShuffleOp::create(e.b, e.loc, nibbles, nibbles,
                                        everyOther(width, 1));
  e.storeBytes(mlir::attnres::residual::pack(e.b, e.loc, even, odd),
               residualBase, residualByte);
}

/// Stores the chunk vectors of a row where `valid` (i1) holds. With a
/// `residualBase`, also the residuals of the chunks' rounding to the 16-bit
/// `element`, chunk by chunk (so that a chunk's registers are free once it
/// is stored). With `accumulate`, adds each chunk to what the row holds
/// (loaded, widened, added in FP32, rounded once), one chunk at a time,
/// except where `overwrite` (i1, optional) holds: there the row is written
/// without being read.
void storeRow(KernelEmitter &e, ArrayRef<Value> chunks, Value base, Value row,
              Type element, Value valid, Value residualBase = {},
              bool accumulate = false, Value overwrite = {}) {
  Value adds;
  if (accumulate && overwrite)
    adds = arith::XOrIOp::create(
        e.b, e.loc, overwrite, arith::ConstantIntOp::create(e.b, e.loc, 1, 1));
  int64_t width = e.layout.vectorWidth;
  Value rowStart = e.mulI(row, e.constI64(e.layout.width));
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    Value inRow = arith::AndIOp::create(e.b, e.loc, valid, e.chunkActive[c]);
    e.ifThen(inRow, [&] {
      Value index =
          e.addI(rowStart, e.mulI(e.vectorIndex[c], e.constI64(width)));
      if (accumulate) {
        // One chunk at a time: the row's old values are not all held in
        // registers at once.
        auto add = [&] {
          e.storeVector(e.add(chunks[c], e.loadVector(base, index, element)),
                        base, index, element);
        };
        if (!overwrite)
          return add();
        // The same in every lane of the row: no divergence.
        e.ifThen(overwrite,
                 [&] { e.storeVector(chunks[c], base, index, element); });
        e.ifThen(adds, add);
        return;
      }
      if (!residualBase) {
        e.storeVector(chunks[c], base, index, element);
        return;
      }
      storeWithResidual(e, chunks[c], base, index, element, residualBase,
                        residualIndex(e, row, c));
    });
  }
}

/// The weight of a partition of lse `x` in a softmax merge whose largest
/// lse is `maximum`: 0 for an empty partition (lse -inf), 1 at the maximum
/// (so that a +inf maximum gives 1, not inf - inf), exp(x - max) otherwise.
Value partitionWeight(KernelEmitter &e, Value x, Value maximum) {
  Value w =
      e.select(e.equal(x, maximum), e.constF32(1.0), e.exp(e.sub(x, maximum)));
  return e.select(e.equal(x, e.constF32(-kInf)), e.constF32(0.0), w);
}

/// The FP32 o_pre of a row from its 16-bit values `rounded` (FP32 chunks, as
/// loadRow returns them) and the residual buffer's row.
SmallVector<Value> decodeResidualRow(KernelEmitter &e, ArrayRef<Value> rounded,
                                     Value base, Value row, Type element) {
  int64_t width = e.layout.vectorWidth, half = width / 2;
  int64_t bits = mlir::attnres::residual::fractionBits(element);
  SmallVector<int64_t> interleave;
  for (int64_t j = 0; j < half; ++j)
    interleave.append({j, half + j});
  SmallVector<Value> decoded;
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    // The clamped index keeps an inactive chunk's load inside the row; its
    // rounded value is 0, which decodes to 0 whatever the bits.
    Value bytes = e.loadBytes(base, residualIndex(e, row, c), half);
    auto [low, high] = mlir::attnres::residual::unpack(e.b, e.loc, bytes);
    Value nibbles =
        vector::ShuffleOp::create(e.b, e.loc, low, high, interleave);
    decoded.push_back(
        mlir::attnres::residual::decode(e.b, e.loc, rounded[c], nibbles, bits));
  }
  return decoded;
}

/// sum_c <x_c, y_c> as one chain of fused multiply-adds over the elements
/// in order: one live register per sum, so that a thread can form several
/// sums of a row without holding the row's products.
Value dotChunks(KernelEmitter &e, ArrayRef<Value> x, ArrayRef<Value> y) {
  Value total;
  for (auto [u, v] : llvm::zip(x, y))
    for (int64_t j = 0; j < e.layout.vectorWidth; ++j) {
      Value product =
          e.mul(vector::ExtractOp::create(e.b, e.loc, u, ArrayRef<int64_t>{j}),
                vector::ExtractOp::create(e.b, e.loc, v, ArrayRef<int64_t>{j}));
      total = total ? e.add(total, product) : product;
    }
  return total;
}

SmallVector<Value> scaleChunks(KernelEmitter &e, ArrayRef<Value> x,
                               Value factor) {
  SmallVector<Value> result;
  Value splat = e.splat(factor, e.layout.vectorWidth);
  for (Value v : x)
    result.push_back(e.mul(v, splat));
  return result;
}

/// rho = 1 / sqrt(total / count + eps).
Value normFactor(KernelEmitter &e, Value total, int64_t count, double eps) {
  return e.rsqrt(e.add(e.div(total, e.constF32(static_cast<double>(count))),
                       e.constF32(eps)));
}

/// The output-norm weight rows of the chunks: one per query, or one shared.
SmallVector<SmallVector<Value>> loadWeightRows(KernelEmitter &e, Value base,
                                               Type element, int64_t rows) {
  SmallVector<SmallVector<Value>> weights;
  for (int64_t r = 0; r < rows; ++r)
    weights.push_back(loadRow(e, base, e.constI64(r), element));
  return weights;
}

/// Keeps the values a scf.for carries in a flat list.
struct Carried {
  SmallVector<Value> values;
  unsigned add(ArrayRef<Value> more) {
    unsigned start = values.size();
    llvm::append_range(values, more);
    return start;
  }
};

/// sum over the key coordinates of x^2: all of them when R = D (rows are
/// zero outside their chunks), else those `keyMasks` selects.
Value keySquares(KernelEmitter &e, ArrayRef<Value> row,
                 ArrayRef<Value> keyMasks) {
  if (keyMasks.empty())
    return dotChunks(e, row, row);
  Value total;
  for (auto [c, v] : llvm::enumerate(row)) {
    Value squares = e.select(keyMasks[c], e.mul(v, v), e.zeroVector());
    total = total ? e.add(total, squares) : squares;
  }
  return e.sumVector(total);
}

/// One source of a batch: its index, whether the row reads it (null:
/// always) and its row as FP32 chunk vectors (zero outside the row).
struct SourceSlot {
  Value index;
  Value valid;
  SmallVector<Value> row;
  /// The chunks as loaded (before the FP32 extension).
  SmallVector<Value> raw;
};

/// The slot's row in FP32 once more, for the uses after a row sum. For
/// bf16 the extension is redone from the stored bits (a bf16 is the high
/// half of its f32), written differently from the first one so that the
/// compiler does not merge the two: the row is kept across the row sum at
/// the width it was loaded with, half the registers.
SmallVector<Value> rowAgain(KernelEmitter &e, const SourceSlot &slot) {
  SmallVector<Value> row;
  for (auto [c, raw] : llvm::enumerate(slot.raw)) {
    auto type = cast<VectorType>(raw.getType());
    if (!type.getElementType().isBF16()) {
      row.push_back(slot.row[c]);
      continue;
    }
    OpBuilder &b = e.b;
    auto bits16 = type.clone(b.getI16Type()),
         bits32 = type.clone(b.getI32Type());
    Value bits = LLVM::BitcastOp::create(b, e.loc, bits16, raw);
    Value wide = arith::ExtUIOp::create(b, e.loc, bits32, bits);
    Value shifted = arith::ShLIOp::create(
        b, e.loc, wide,
        arith::ConstantOp::create(
            b, e.loc, bits32,
            DenseElementsAttr::get(bits32, b.getI32IntegerAttr(16))));
    Value value =
        LLVM::BitcastOp::create(b, e.loc, type.clone(b.getF32Type()), shifted);
    row.push_back(e.select(e.chunkActive[c], value, e.zeroVector()));
  }
  return row;
}

/// What one row sum gives a batch: for every slot the RMS factor rho of its
/// key, ell[m] = rho * <t, a_m> (the logit is scale * ell) and <v, x_j> for
/// each extra row x_j.
struct BatchSums {
  SmallVector<Value> rho;
  SmallVector<SmallVector<Value>> ell, extra;
};

BatchSums sumBatch(KernelEmitter &e, const AttnResSpec &spec,
                   ArrayRef<SourceSlot> slots,
                   ArrayRef<SmallVector<Value>> queries,
                   ArrayRef<SmallVector<Value>> extraRows,
                   ArrayRef<Value> keyMasks, Value half) {
  int64_t M = queries.size(), X = extraRows.size(), stride = 1 + M + X;
  SmallVector<Value> partials;
  for (const SourceSlot &slot : slots) {
    partials.push_back(keySquares(e, slot.row, keyMasks));
    for (ArrayRef<Value> query : queries)
      partials.push_back(dotChunks(e, slot.row, query));
    for (ArrayRef<Value> row : extraRows)
      partials.push_back(dotChunks(e, slot.row, row));
  }
  SmallVector<Value> sums = e.rowSum(partials, half);
  BatchSums result;
  for (int64_t i = 0, n = slots.size(); i < n; ++i) {
    Value rho = normFactor(e, sums[i * stride], spec.rank, spec.eps);
    result.rho.push_back(rho);
    result.ell.emplace_back();
    for (int64_t m = 0; m < M; ++m)
      result.ell.back().push_back(e.mul(rho, sums[i * stride + 1 + m]));
    result.extra.emplace_back(sums.begin() + i * stride + 1 + M,
                              sums.begin() + (i + 1) * stride);
  }
  return result;
}

/// The logit z = scale * ell of a source for one query.
Value logitOf(KernelEmitter &e, const AttnResSpec &spec, Value ell) {
  return e.mul(e.constF32(spec.scale), ell);
}

/// The softmax weight p = exp(z - lse) of a source, from its ell and the
/// row's lse (the backward's, which has the lse the forward saved). With
/// one source it is 1: the backward's logit, reduced in another order than
/// the forward's or with its last product fused into the subtraction, can
/// differ from the saved lse in its last bits, and p = exp(tiny) would
/// leave dq, dg and dv - do not exactly zero.
Value weightOf(KernelEmitter &e, const AttnResSpec &spec, Value ell,
               Value lse) {
  if (spec.numSources == 1)
    return e.constF32(1.0);
  return e.exp(e.sub(logitOf(e, spec, ell), lse));
}

/// What a source walk does with a batch: the next state from the slots and
/// the state, reducing its row sums through workgroup half `half`; `first`
/// says the batch is statically the first one.
using BatchBody = function_ref<SmallVector<Value>(
    ArrayRef<SourceSlot> slots, ValueRange state, Value half, bool first)>;

/// Walks the sources of one row in batches (SourceSchedule): the rows of a
/// batch are all loaded before its row sums, the next batch's rows are
/// loaded before the current batch is reduced (prefetch), and the table
/// entries one batch further still, so no load waits on a pointer.
class SourceWalker {
public:
  SourceWalker(KernelEmitter &e, Value table, Type element, Value row,
               int64_t numSources, SourceSchedule schedule)
      : e(e), table(table), element(element), numSources(numSources),
        schedule(schedule) {
    batch = batchFor(schedule, numSources);
    rowStart = e.mulI(row, e.constI64(e.layout.width));
  }

  /// The sources of a batch: the schedule's, at most all of them.
  static int64_t batchFor(const SourceSchedule &schedule, int64_t numSources) {
    return std::clamp<int64_t>(schedule.batch, 1, numSources);
  }

  /// All L sources: unrolled at compile time up to the schedule's limit,
  /// else a loop.
  SmallVector<Value> all(ValueRange state, BatchBody body) {
    if (numSources > schedule.unrollLimit || schedule.stagedBatches > 0)
      return range(e.constI64(0), e.constI64(numSources), state, body);
    int64_t batches = llvm::divideCeil(numSources, batch);
    auto pointersOf = [&](int64_t t) {
      SmallVector<Value> pointers;
      for (int64_t s = t * batch; s < std::min(numSources, (t + 1) * batch);
           ++s)
        pointers.push_back(e.loadPointer(table, e.constI64(s)));
      return pointers;
    };
    SmallVector<SmallVector<Value>> pointers(batches + 1);
    SmallVector<SmallVector<SmallVector<Value>>> rows(batches + 1);
    pointers[0] = pointersOf(0);
    if (schedule.prefetch) {
      rows[0] = loadRows(pointers[0]);
      if (batches > 1)
        pointers[1] = pointersOf(1);
    }
    SmallVector<Value> current(state);
    for (int64_t t = 0; t < batches; ++t) {
      if (schedule.prefetch) {
        if (t + 1 < batches)
          rows[t + 1] = loadRows(pointers[t + 1]);
        if (t + 2 < batches)
          pointers[t + 2] = pointersOf(t + 2);
      } else {
        rows[t] = loadRows(pointers[t]);
        if (t + 1 < batches)
          pointers[t + 1] = pointersOf(t + 1);
      }
      SmallVector<SourceSlot> slots;
      for (auto [i, raw] : llvm::enumerate(rows[t]))
        slots.push_back({e.constI64(t * batch + i), Value(), extend(raw),
                         SmallVector<Value>(raw)});
      current = body(slots, current, e.constI64(t % 2), t == 0);
    }
    return current;
  }

  /// Sources [begin, end) (i64, end > begin) in a loop over batches; the
  /// slots past `end` of the last batch are invalid.
  /// The loads a walk over [begin, end) starts with (the first batch's
  /// table entries, and its rows when prefetching): issued by `range`, or
  /// earlier, so that they are in flight while the caller does other work.
  SmallVector<Value> start(Value begin, Value end) {
    SmallVector<Value> started;
    if (schedule.stagedBatches > 0) {
      // The first stagedBatches batches go out now; the walk carries the
      // table entries of the next one to copy.
      for (int64_t z = 0; z < schedule.stagedBatches; ++z)
        copyBatch(begin, end, e.constI64(z),
                  pointersOf(begin, end, e.constI64(z)));
      return pointersOf(begin, end, e.constI64(schedule.stagedBatches));
    }
    SmallVector<Value> firstPointers = pointersOf(begin, end, e.constI64(0));
    if (schedule.prefetch) {
      SmallVector<SmallVector<Value>> firstRows = loadRows(firstPointers);
      llvm::append_range(started, pointersOf(begin, end, e.constI64(1)));
      for (auto &row : firstRows)
        llvm::append_range(started, row);
    } else {
      llvm::append_range(started, firstPointers);
    }
    return started;
  }

  SmallVector<Value> range(Value begin, Value end, ValueRange state,
                           BatchBody body, ArrayRef<Value> started = {}) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value batches = e.ceilDivI(arith::SubIOp::create(b, loc, end, begin),
                               e.constI64(batch));
    auto firstOf = [&](Value t) {
      return e.addI(begin, e.mulI(t, e.constI64(batch)));
    };
    // Carried: the state, the pointers of the batch after the current one
    // (prefetch) or of the current one, and the current rows (prefetch).
    SmallVector<Value> init(state);
    unsigned pointersAt = init.size();
    unsigned rowsAt = pointersAt + batch;
    if (started.empty())
      llvm::append_range(init, start(begin, end));
    else
      llvm::append_range(init, started);
    int64_t C = e.layout.chunks;
    // Staged: batch t is in its ring slots once all but the stagedBatches - 1
    // newest copy groups are done; its rows are read into registers and
    // batch t + stagedBatches is copied into the same slots before the batch
    // is reduced, so stagedBatches batches stay in flight. The slots are
    // this thread's alone: its reads of batch t are issued before its copies
    // over them.
    int64_t Z = schedule.stagedBatches;
    auto loop = scf::ForOp::create(
        b, loc, e.constI64(0), batches, e.constI64(1), init,
        [&](OpBuilder &nested, Location, Value t, ValueRange carried) {
          OpBuilder::InsertionGuard guard(b);
          b.setInsertionPoint(nested.getInsertionBlock(),
                              nested.getInsertionPoint());
          SmallVector<Value> pointers(carried.begin() + pointersAt,
                                      carried.begin() + pointersAt + batch);
          SmallVector<SmallVector<Value>> rows, nextRows;
          SmallVector<Value> nextPointers;
          if (Z > 0) {
            NVVM::CpAsyncWaitGroupOp::create(b, loc, Z - 1);
            rows = readStaged(arith::RemUIOp::create(b, loc, t, e.constI64(Z)));
            copyBatch(begin, end, e.addI(t, e.constI64(Z)), pointers);
            nextPointers = pointersOf(begin, end, e.addI(t, e.constI64(Z + 1)));
          } else if (schedule.prefetch) {
            for (int64_t i = 0; i < batch; ++i)
              rows.push_back(
                  SmallVector<Value>(carried.begin() + rowsAt + i * C,
                                     carried.begin() + rowsAt + (i + 1) * C));
            nextRows = loadRows(pointers);
            nextPointers = pointersOf(begin, end, e.addI(t, e.constI64(2)));
          } else {
            rows = loadRows(pointers);
            nextPointers = pointersOf(begin, end, e.addI(t, e.constI64(1)));
          }
          Value first = firstOf(t);
          SmallVector<SourceSlot> slots;
          for (int64_t i = 0; i < batch; ++i) {
            Value index = e.addI(first, e.constI64(i));
            slots.push_back(
                {index, e.lessThan(index, end), extend(rows[i]), rows[i]});
          }
          Value half = arith::AndIOp::create(b, loc, t, e.constI64(1));
          SmallVector<Value> next =
              body(slots, carried.take_front(pointersAt), half, false);
          llvm::append_range(next, nextPointers);
          for (auto &row : nextRows)
            llvm::append_range(next, row);
          scf::YieldOp::create(b, loc, next);
        });
    return SmallVector<Value>(loop.getResults().take_front(pointersAt));
  }

  /// Floats of workgroup memory the staging ring of `schedule` takes in a
  /// block of `layout` streaming `element` rows.
  static int64_t stagingFloats(const SourceSchedule &schedule,
                               const RowLayout &layout, Type element,
                               int64_t numSources) {
    if (schedule.stagedBatches == 0)
      return 0;
    return schedule.stagedBatches * batchFor(schedule, numSources) *
           layout.chunks * layout.blockThreads() *
           vectorFloats(layout, element);
  }

private:
  /// Floats a chunk vector of `element` takes (a copy moves 4, 8 or 16
  /// bytes).
  static int64_t vectorFloats(const RowLayout &layout, Type element) {
    return std::max<int64_t>(1, layout.vectorWidth *
                                    element.getIntOrFloatBitWidth() / 32);
  }

  /// Float offset of chunk c of slot i of ring position `ring`: a thread's
  /// vectors of a chunk lie next to its neighbours' (conflict-free reads).
  Value stagedOffset(Value ring, int64_t i, int64_t c) {
    int64_t floats = vectorFloats(e.layout, element);
    int64_t threads = e.layout.blockThreads(), C = e.layout.chunks;
    Value slot = e.addI(e.mulI(ring, e.constI64(batch)), e.constI64(i));
    Value vector =
        e.addI(e.mulI(e.addI(e.mulI(slot, e.constI64(C)), e.constI64(c)),
                      e.constI64(threads)),
               e.thread);
    return e.addI(e.constI64(schedule.stagingOffset),
                  e.mulI(vector, e.constI64(floats)));
  }

  /// Copies the rows of batch t of [begin, end) (those in the range) into
  /// ring position t mod stagedBatches, as one copy group.
  void copyBatch(Value begin, Value end, Value t, ArrayRef<Value> pointers) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value ring =
        arith::RemUIOp::create(b, loc, t, e.constI64(schedule.stagedBatches));
    int64_t bytes = vectorFloats(e.layout, element) * 4;
    Value first = e.addI(begin, e.mulI(t, e.constI64(batch)));
    for (int64_t i = 0; i < batch; ++i) {
      e.ifThen(e.lessThan(e.addI(first, e.constI64(i)), end), [&] {
        for (int64_t c = 0; c < e.layout.chunks; ++c) {
          Value index =
              e.addI(rowStart, e.mulI(e.vectorIndex[c],
                                      e.constI64(e.layout.vectorWidth)));
          Value source = LLVM::GEPOp::create(
              b, loc, LLVM::LLVMPointerType::get(b.getContext(), 1), element,
              pointers[i], ValueRange{index});
          NVVM::CpAsyncOp::create(b, loc,
                                  e.workgroupPointer(stagedOffset(ring, i, c)),
                                  source, bytes,
                                  bytes == 16 ? NVVM::LoadCacheModifierKind::CG
                                              : NVVM::LoadCacheModifierKind::CA,
                                  Value());
        }
      });
    }
    NVVM::CpAsyncCommitGroupOp::create(b, loc);
  }

  /// The raw chunk vectors of the batch at ring position `ring`.
  SmallVector<SmallVector<Value>> readStaged(Value ring) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    int64_t floats = vectorFloats(e.layout, element);
    auto words = VectorType::get({floats}, b.getF32Type());
    auto raw = VectorType::get({e.layout.vectorWidth}, element);
    SmallVector<SmallVector<Value>> rows;
    for (int64_t i = 0; i < batch; ++i) {
      SmallVector<Value> chunks;
      for (int64_t c = 0; c < e.layout.chunks; ++c) {
        Value at = arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                              stagedOffset(ring, i, c));
        Value loaded = vector::LoadOp::create(
            b, loc, words, e.workgroupBuffer(), ValueRange{at},
            /*nontemporal=*/false, llvm::MaybeAlign(floats * 4));
        chunks.push_back(vector::BitCastOp::create(b, loc, raw, loaded));
      }
      rows.push_back(chunks);
    }
    return rows;
  }

  /// The table entries of batch t of [begin, end), clamped into the range.
  SmallVector<Value> pointersOf(Value begin, Value end, Value t) {
    SmallVector<Value> pointers;
    Value first = e.addI(begin, e.mulI(t, e.constI64(batch)));
    Value last = e.addI(end, e.constI64(-1));
    for (int64_t i = 0; i < batch; ++i)
      pointers.push_back(
          e.loadPointer(table, e.minI(e.addI(first, e.constI64(i)), last)));
    return pointers;
  }

  SmallVector<SmallVector<Value>> loadRows(ArrayRef<Value> pointers) {
    SmallVector<SmallVector<Value>> rows;
    for (Value pointer : pointers) {
      SmallVector<Value> chunks;
      for (int64_t c = 0; c < e.layout.chunks; ++c) {
        Value index =
            e.addI(rowStart,
                   e.mulI(e.vectorIndex[c], e.constI64(e.layout.vectorWidth)));
        chunks.push_back(e.loadVectorRaw(pointer, index, element));
      }
      rows.push_back(chunks);
    }
    return rows;
  }
  SmallVector<Value> extend(ArrayRef<Value> raw) {
    SmallVector<Value> row;
    for (auto [c, chunk] : llvm::enumerate(raw))
      row.push_back(
          e.select(e.chunkActive[c], e.extend(chunk), e.zeroVector()));
    return row;
  }

  KernelEmitter &e;
  Value table;
  Type element;
  int64_t numSources;
  SourceSchedule schedule;
  int64_t batch;
  Value rowStart;
};

/// The workgroup floats of a kernel whose row sums `e` planned and whose
/// source walk follows `schedule`: the row sums, then the staging ring
/// (16-byte aligned), whose offset `schedule` is given.
int64_t withStaging(SourceSchedule &schedule, const KernelEmitter &e,
                    const RowLayout &layout, Type element, int64_t numSources) {
  schedule.stagingOffset = llvm::alignTo(e.reductionFloats(), 4);
  int64_t staging =
      SourceWalker::stagingFloats(schedule, layout, element, numSources);
  return std::max<int64_t>(1, staging ? schedule.stagingOffset + staging
                                      : e.reductionFloats());
}
} // namespace

//===----------------------------------------------------------------------===//
// the merge of a clustered forward
//===----------------------------------------------------------------------===//

namespace {

/// Floats of a row's region in a clustered forward's workgroup memory: M
/// partial rows of D, M lse and M sums of squares.
int64_t clusterRegionFloats(const AttnResSpec &spec) {
  return spec.numQueries * (spec.width + 2);
}
/// Floats from one row's region to the next: 16-byte aligned, as the rows'
/// vector stores and peer loads need.
int64_t clusterRegionStride(const AttnResSpec &spec) {
  return llvm::alignTo(clusterRegionFloats(spec), 4);
}

/// What a clustered forward writes once its blocks have merged.
struct ClusterMergeArgs {
  Value tokens, partitions;
  Value o, lse, oPre, residual, outputNorm; // oPre, residual, outputNorm: opt.
};

/// Every thread of the cluster's blocks arrives (release) and waits
/// (acquire): the workgroup memory each wrote before is visible to all.
/// Aligned: every thread of a warp reaches it together (uniform control
/// flow).
void clusterBarrier(KernelEmitter &e) {
  NVVM::ClusterArriveOp::create(e.b, e.loc, e.b.getUnitAttr());
  NVVM::ClusterWaitOp::create(e.b, e.loc, e.b.getUnitAttr());
}

/// The merge of the P partial rows of a row by the P blocks of its cluster
/// (ForwardKind::ClusterMerged). Each row group of a block (one, or several
/// small rows of a subgroup or less each) puts its normalized partial rows
/// `oPreRows` and their `lses` into its region of the block's workgroup
/// memory (from float `regionAt`, a region a row); after a cluster barrier,
/// the row group of block p merges the p-th of P column tiles of every
/// query's row from the P regions of its row (reads through distributed
/// shared memory, 16 bytes at a time) with its own lanes, and writes o,
/// o_pre and the residual there. An output norm needs the merged row's mean
/// square: each block adds its tile's squares, the P sums go through the
/// regions once more, and the tile is merged again to apply it. A last
/// barrier keeps every block's region alive until its peers have read it.
void mergeInCluster(KernelEmitter &e, const AttnResSpec &spec,
                    const ClusterMergeArgs &args,
                    ArrayRef<SmallVector<Value>> oPreRows, ArrayRef<Value> lses,
                    Value row, Value valid, int64_t regionAt) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  MLIRContext *context = b.getContext();
  const RowLayout &layout = e.layout;
  int64_t M = spec.numQueries, D = spec.width, V = D / 4;
  assert(D % 4 == 0);
  Type f32 = e.f32;
  auto sharedPointer = LLVM::LLVMPointerType::get(context, 3);
  auto clusterPointer = LLVM::LLVMPointerType::get(context, 7);
  auto vector4 = VectorType::get({4}, f32);
  // The region of a row: M rows of D floats, M lse, M sums of squares.
  int64_t lseAt = M * D, squaresAt = M * D + M;
  // The row group's region (one statement an op: the IR must not depend on
  // the order the C++ compiler evaluates a call's arguments in). With one
  // row a block the group is 0; LLVM folds the offset away.
  Value stride = e.constI64(clusterRegionStride(spec));
  Value groupOffset = e.mulI(e.group, stride);
  Value region = e.workgroupPointer(e.addI(e.constI64(regionAt), groupOffset));
  auto elementAt = [&](Value base, Type pointer, int64_t offset, Value index) {
    return LLVM::GEPOp::create(b, loc, pointer, f32, base,
                               ValueRange{e.addI(e.constI64(offset), index)});
  };
  Value isLane0 = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                        e.lane, e.constI64(0));

  int64_t width = layout.vectorWidth;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < layout.chunks; ++c)
      e.ifThen(e.chunkActive[c], [&] {
        Value index = e.mulI(e.vectorIndex[c], e.constI64(width));
        LLVM::StoreOp::create(b, loc, oPreRows[m][c],
                              elementAt(region, sharedPointer, m * D, index),
                              std::min<int64_t>(16, width * 4));
      });
  // Lane 0 of the row puts one scalar a query at `offset` of the region,
  // then the cluster's blocks meet.
  auto publish = [&](ArrayRef<Value> values, int64_t offset) {
    e.ifThen(isLane0, [&] {
      for (auto [m, value] : llvm::enumerate(values))
        LLVM::StoreOp::create(
            b, loc, value,
            elementAt(region, sharedPointer, offset + m, e.constI64(0)), 4);
    });
    clusterBarrier(e);
  };
  publish(lses, lseAt);

  // The regions of partitions 0 .. kMaxClusterBlocks - 1; those past P
  // stand for partition P - 1 and weigh 0, so that every load is issued at
  // once without a loop over a run-time P.
  Value P = args.partitions;
  Value lastPartition = e.addI(P, e.constI64(-1));
  SmallVector<Value> peers, isPartition;
  for (int64_t p = 0; p < kMaxClusterBlocks; ++p) {
    Value rank = arith::TruncIOp::create(b, loc, b.getI32Type(),
                                         e.minI(e.constI64(p), lastPartition));
    peers.push_back(
        NVVM::MapaOp::create(b, loc, clusterPointer, region, rank).getResult());
    isPartition.push_back(e.lessThan(e.constI64(p), P));
  }
  // The scalar at `offset` of every partition's region.
  auto peerScalars = [&](int64_t offset) {
    SmallVector<Value> values;
    for (Value peer : peers)
      values.push_back(LLVM::LoadOp::create(
          b, loc, f32, elementAt(peer, clusterPointer, offset, e.constI64(0)),
          4));
    return values;
  };

  // Per query: the partitions' weights, their total and the merged lse.
  SmallVector<SmallVector<Value>> weights(M);
  SmallVector<Value> anyMass, inverse, mergedLse;
  Value negInf = e.constF32(-kInf);
  for (int64_t m = 0; m < M; ++m) {
    SmallVector<Value> partitionLse = peerScalars(lseAt + m);
    // A repeated partition P - 1 leaves the maximum as it is.
    Value maximum = negInf;
    for (Value lse : partitionLse)
      maximum = e.maximum(maximum, lse);
    Value total = e.constF32(0.0);
    for (int64_t p = 0; p < kMaxClusterBlocks; ++p) {
      Value w =
          e.select(isPartition[p], partitionWeight(e, partitionLse[p], maximum),
                   e.constF32(0.0));
      weights[m].push_back(w);
      total = e.add(total, w);
    }
    anyMass.push_back(e.greater(total, e.constF32(0.0)));
    inverse.push_back(e.div(e.constF32(1.0), total));
    mergedLse.push_back(
        e.select(anyMass.back(), e.add(maximum, e.log(total)), negInf));
  }

  // This block's tile: vectors [begin, end) of the V vectors of 4 of a row,
  // a vector a lane of the row per step.
  Value tile = e.ceilDivI(e.constI64(V), P);
  Value begin = e.mulI(e.blockY, tile);
  Value end = e.minI(e.addI(begin, tile), e.constI64(V));
  Value threads = e.constI64(layout.threadsPerRow);
  Value steps = e.ceilDivI(tile, threads);
  Value zero = e.splat(e.constF32(0.0), 4);
  auto merged = [&](int64_t m, Value u) {
    Value index = e.mulI(u, e.constI64(4));
    SmallVector<Value> parts;
    for (int64_t p = 0; p < kMaxClusterBlocks; ++p)
      parts.push_back(LLVM::LoadOp::create(
          b, loc, vector4, elementAt(peers[p], clusterPointer, m * D, index),
          16));
    Value acc = zero;
    for (int64_t p = 0; p < kMaxClusterBlocks; ++p) {
      Value contributes = e.splat(e.greater(weights[m][p], e.constF32(0.0)), 4);
      acc = e.add(acc,
                  e.select(contributes,
                           e.mul(parts[p], e.splat(weights[m][p], 4)), zero));
    }
    return e.select(e.splat(anyMass[m], 4), e.mul(acc, e.splat(inverse[m], 4)),
                    zero);
  };
  // Element index of vector u of query m's output row, and byte index of its
  // residuals.
  auto outIndex = [&](int64_t m, Value u) {
    Value outRow = e.addI(e.mulI(e.constI64(m), args.tokens), row);
    return e.addI(e.mulI(outRow, e.constI64(D)), e.mulI(u, e.constI64(4)));
  };
  // Global loads and stores of the tile's vectors of 4.
  RowLayout tileLayout = layout;
  tileLayout.vectorWidth = 4;
  KernelEmitter tile4(b, loc, tileLayout);
  auto store = [&](Value vector, Value base, int64_t m, Value u,
                   Value residualBase) {
    Value index = outIndex(m, u);
    if (!residualBase)
      return tile4.storeVector(vector, base, index, spec.output);
    storeWithResidual(e, vector, base, index, spec.output, residualBase,
                      e.divI(index, e.constI64(2)));
  };
  // Runs `body(u, active)` over the tile's vectors, carrying `init`.
  auto overTile =
      [&](ValueRange init,
          function_ref<SmallVector<Value>(Value, Value, ValueRange)> body) {
        auto loop = scf::ForOp::create(
            b, loc, e.constI64(0), steps, e.constI64(1), init,
            [&](OpBuilder &nested, Location, Value step, ValueRange carried) {
              OpBuilder::InsertionGuard guard(b);
              b.setInsertionPoint(nested.getInsertionBlock(),
                                  nested.getInsertionPoint());
              Value u = e.addI(begin, e.addI(e.lane, e.mulI(step, threads)));
              Value active =
                  arith::AndIOp::create(b, loc, valid, e.lessThan(u, end));
              // Inactive lanes read a vector of the row and store nothing.
              Value clamped = e.minI(u, e.constI64(V - 1));
              scf::YieldOp::create(b, loc, body(clamped, active, carried));
            });
        return SmallVector<Value>(loop.getResults());
      };

  bool oPre = static_cast<bool>(args.oPre);
  if (!args.outputNorm) {
    overTile({}, [&](Value u, Value active, ValueRange) {
      for (int64_t m = 0; m < M; ++m) {
        Value o = merged(m, u);
        e.ifThen(active, [&] {
          store(o, args.o, m, u, oPre ? Value() : args.residual);
          if (oPre)
            store(o, args.oPre, m, u, args.residual);
        });
      }
      return SmallVector<Value>{};
    });
  } else {
    // Pass 1: o_pre, and the tile's squares.
    SmallVector<Value> squares = overTile(
        SmallVector<Value>(M, e.constF32(0.0)),
        [&](Value u, Value active, ValueRange carried) {
          SmallVector<Value> next;
          for (int64_t m = 0; m < M; ++m) {
            Value oPreVector = merged(m, u);
            if (oPre)
              e.ifThen(active, [&] {
                store(oPreVector, args.oPre, m, u, args.residual);
              });
            Value square = e.sumVector(e.mul(oPreVector, oPreVector));
            next.push_back(
                e.add(carried[m], e.select(active, square, e.constF32(0.0))));
          }
          return next;
        });
    publish(e.rowSum(squares), squaresAt);
    SmallVector<Value> rho;
    for (int64_t m = 0; m < M; ++m) {
      Value total = e.constF32(0.0);
      for (auto [p, square] : llvm::enumerate(peerScalars(squaresAt + m)))
        total = e.add(total, e.select(isPartition[p], square, e.constF32(0.0)));
      rho.push_back(normFactor(e, total, D, spec.eps));
    }
    // Pass 2: o = o_pre * rho * weight.
    overTile({}, [&](Value u, Value active, ValueRange) {
      for (int64_t m = 0; m < M; ++m) {
        Value weightRow = e.constI64(spec.perQueryOutputNorm ? m : 0);
        Value h = tile4.loadVector(
            args.outputNorm,
            e.addI(e.mulI(weightRow, e.constI64(D)), e.mulI(u, e.constI64(4))),
            spec.outputNorm);
        Value o = e.mul(e.mul(merged(m, u), e.splat(rho[m], 4)), h);
        e.ifThen(active, [&] {
          store(o, args.o, m, u, oPre ? Value() : args.residual);
        });
      }
      return SmallVector<Value>{};
    });
  }
  Value writesLse = arith::AndIOp::create(
      b, loc, arith::AndIOp::create(b, loc, valid, isLane0),
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, e.blockY,
                            e.constI64(0)));
  e.ifThen(writesLse, [&] {
    for (int64_t m = 0; m < M; ++m)
      e.storeScalar(mergedLse[m], args.lse,
                    e.addI(e.mulI(e.constI64(m), args.tokens), row), f32);
  });
  clusterBarrier(e);
}

} // namespace

//===----------------------------------------------------------------------===//
// forward and partial forward
//===----------------------------------------------------------------------===//

namespace {
/// The workgroup memory of a forward kernel, in floats: the row sums `e`
/// plans here, the staging ring (whose offset goes into `schedule`) and, for
/// the clustered forward, a region a row of the block (from `clusterAt`).
struct ForwardWorkgroup {
  int64_t floats = 0, clusterAt = 0;
};
ForwardWorkgroup planForward(KernelEmitter &e, SourceSchedule &schedule,
                             const AttnResSpec &spec, ForwardKind kind) {
  int64_t L = spec.numSources, M = spec.numQueries;
  e.planReductions(/*settled=*/M,
                   /*loop=*/SourceWalker::batchFor(schedule, L) * (1 + M));
  ForwardWorkgroup plan;
  plan.floats = withStaging(schedule, e, e.layout, spec.value, L);
  plan.clusterAt = llvm::alignTo(plan.floats, 8);
  if (kind == ForwardKind::ClusterMerged)
    plan.floats = plan.clusterAt +
                  (e.layout.rowsPerBlock - 1) * clusterRegionStride(spec) +
                  clusterRegionFloats(spec);
  return plan;
}
} // namespace

int64_t mlir::attnres::gpu_kernels::forwardWorkgroupBytes(
    OpBuilder &b, Location loc, const AttnResSpec &spec, RowLayout layout,
    SourceSchedule schedule, ForwardKind kind) {
  KernelEmitter e(b, loc, layout);
  return planForward(e, schedule, spec, kind).floats * 4;
}

KernelInfo mlir::attnres::gpu_kernels::emitForwardKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    RowLayout layout, SourceSchedule schedule, ForwardKind kind,
    const LaunchBody *into) {
  assert((!into || kind == ForwardKind::Whole) &&
         "a launch body takes a whole forward over the rows it is given");
  bool partial = kind == ForwardKind::Partial;
  bool clustered = kind == ForwardKind::ClusterMerged;
  // Partial and clustered walk the sources of partition blockIdx.y.
  bool split = partial || clustered;
  KernelBuilder k(b, loc, name,
                  partial     ? "forward_partial"
                  : clustered ? "forward_cluster"
                              : "forward",
                  into);
  int64_t L = spec.numSources, D = spec.width, R = spec.rank,
          M = spec.numQueries, C = layout.chunks;
  Type f32 = b.getF32Type();
  unsigned sources = k.table("sources", spec.value, "L x [N, D]");
  unsigned query = queryBuffer(k, spec);
  int keyNorm = keyNormBuffer(k, spec);
  int outputNorm = spec.outputNorm && !partial
                       ? k.buffer("output_norm", spec.outputNorm,
                                  spec.perQueryOutputNorm ? "[M, D]" : "[D]")
                       : -1;
  // The whole forward applies the output norm after its walk; the clustered
  // one after its merge.
  bool norm = spec.outputNorm && kind == ForwardKind::Whole;
  unsigned out = partial ? k.buffer("partial_o", f32, "[P, M, N, D]")
                         : k.buffer("o", spec.output, "[M, N, D]");
  unsigned lseOut = partial ? k.buffer("partial_lse", f32, "[P, M, N]")
                            : k.buffer("lse", f32, "[M, N]");
  bool oPre = !partial && spec.writeOPre;
  int oPreOut = oPre ? k.buffer("o_pre", spec.output, "[M, N, D]") : -1;
  int residualOut =
      !partial && spec.writeResidual
          ? k.buffer("o_pre_residual", b.getI8Type(), "[M, N, D/2]")
          : -1;
  unsigned tokens = k.scalar("num_tokens");
  int partitions = split ? k.scalar("num_partitions") : -1;

  KernelEmitter e(b, loc, layout);
  ForwardWorkgroup plan = planForward(e, schedule, spec, kind);
  k.begin(layout.blockThreads(), plan.floats);
  e.setUpThreads(k.workgroup());
  if (into)
    e.setBlockRows(into->firstRow, into->rowCount);
  Value N = k.arg(tokens);
  // The key coordinates of each chunk; the walks need them only when the
  // key is not the whole row.
  SmallVector<Value> allKeyMasks = e.keyMasks(R);
  SmallVector<Value> keyMasks;
  if (R < D)
    keyMasks = allKeyMasks;
  auto a = keyQuery(e, spec, k.arg(query),
                    keyNorm >= 0 ? k.arg(keyNorm) : Value(), allKeyMasks);

  // Per query: the running maximum, the weight sum and the FP32 output row.
  Carried init;
  unsigned maxAt = init.add(SmallVector<Value>(M, e.constF32(-kInf)));
  unsigned sumAt = init.add(SmallVector<Value>(M, e.constF32(0.0)));
  unsigned accAt = init.add(SmallVector<Value>(M * C, e.zeroVector()));
  int64_t width = layout.vectorWidth;
  // One batch: one row sum for every key's sum of squares and dot products,
  // then the online softmax rescales once per batch.
  auto batchStep = [&](ArrayRef<SourceSlot> slots, ValueRange state, Value half,
                       bool first) {
    BatchSums sums = sumBatch(e, spec, slots, a, {}, keyMasks, half);
    SmallVector<SmallVector<Value>> logits(M);
    for (auto [i, slot] : llvm::enumerate(slots)) {
      for (int64_t m = 0; m < M; ++m) {
        Value z = logitOf(e, spec, sums.ell[i][m]);
        if (slot.valid)
          z = e.select(slot.valid, z, e.constF32(-kInf));
        logits[m].push_back(z);
      }
    }
    SmallVector<Value> maxes, weightSums, accs;
    for (int64_t m = 0; m < M; ++m) {
      Value newMax = logits[m][0];
      for (Value z : ArrayRef<Value>(logits[m]).drop_front())
        newMax = e.maximum(newMax, z);
      Value weightSum;
      SmallVector<Value> acc;
      if (first) {
        // Statically the first batch: nothing to rescale.
        weightSum = e.constF32(0.0);
        acc.assign(C, e.zeroVector());
      } else {
        Value previous = state[maxAt + m];
        newMax = e.maximum(previous, newMax);
        Value alpha = e.exp(e.sub(previous, newMax));
        weightSum = e.mul(state[sumAt + m], alpha);
        Value alphaV = e.splat(alpha, width);
        for (int64_t c = 0; c < C; ++c)
          acc.push_back(e.mul(state[accAt + m * C + c], alphaV));
      }
      for (auto [i, slot] : llvm::enumerate(slots)) {
        // One source's weight is 1, exactly: z - max(z) is not 0 where the
        // logit's last product fuses into the subtraction (an FMA leaves
        // the product's rounding error, 1e-3 at |z| = 1e4), and o must be
        // the source bit for bit.
        Value beta =
            L == 1 ? e.constF32(1.0) : e.exp(e.sub(logits[m][i], newMax));
        weightSum = e.add(weightSum, beta);
        Value betaV = e.splat(beta, width);
        SmallVector<Value> row = rowAgain(e, slot);
        for (int64_t c = 0; c < C; ++c)
          acc[c] = e.add(acc[c], e.mul(row[c], betaV));
      }
      maxes.push_back(newMax);
      weightSums.push_back(weightSum);
      llvm::append_range(accs, acc);
    }
    SmallVector<Value> next;
    llvm::append_range(next, maxes);
    llvm::append_range(next, weightSums);
    llvm::append_range(next, accs);
    return next;
  };

  // The rows of the block, a step of rowsPerBlock rows at a time.
  e.forEachRowStep([&](Value row, Value inTile) {
    Value valid = e.lessThan(row, N);
    if (inTile)
      valid = arith::AndIOp::create(b, loc, valid, inTile);
    Value rowc = e.minI(row, e.addI(N, e.constI64(-1)));
    // The sources of this block: all of them, or partition blockIdx.y.
    SourceWalker walker(e, k.arg(sources), spec.value, rowc, L, schedule);
    SmallVector<Value> results;
    if (split) {
      Value P = k.arg(partitions);
      Value begin = e.divI(e.mulI(e.blockY, e.constI64(L)), P);
      Value end =
          e.divI(e.mulI(e.addI(e.blockY, e.constI64(1)), e.constI64(L)), P);
      results = walker.range(begin, end, init.values, batchStep);
    } else {
      results = walker.all(init.values, batchStep);
    }

    Value isLane0 = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                          e.lane, e.constI64(0));
    Value writesLse = arith::AndIOp::create(b, loc, valid, isLane0);
    SmallVector<SmallVector<Value>> weights;
    if (norm)
      weights = loadWeightRows(e, k.arg(outputNorm), spec.outputNorm,
                               spec.perQueryOutputNorm ? M : 1);
    SmallVector<Value> lses;
    SmallVector<SmallVector<Value>> oPreRows;
    for (int64_t m = 0; m < M; ++m) {
      Value weightSum = results[sumAt + m];
      lses.push_back(e.add(results[maxAt + m], e.log(weightSum)));
      oPreRows.push_back(
          scaleChunks(e,
                      SmallVector<Value>(results.begin() + accAt + m * C,
                                         results.begin() + accAt + (m + 1) * C),
                      e.div(e.constF32(1.0), weightSum)));
    }
    if (clustered) {
      ClusterMergeArgs args{
          N,
          k.arg(partitions),
          k.arg(out),
          k.arg(lseOut),
          oPreOut >= 0 ? k.arg(oPreOut) : Value(),
          residualOut >= 0 ? k.arg(residualOut) : Value(),
          outputNorm >= 0 ? k.arg(outputNorm) : Value(),
      };
      mergeInCluster(e, spec, args, oPreRows, lses, row, valid, plan.clusterAt);
      return;
    }
    // The output norm's mean squares of all queries in one row sum.
    SmallVector<Value> normSums;
    if (norm) {
      SmallVector<Value> squares;
      for (int64_t m = 0; m < M; ++m)
        squares.push_back(dotChunks(e, oPreRows[m], oPreRows[m]));
      normSums = e.rowSum(squares);
    }
    for (int64_t m = 0; m < M; ++m) {
      ArrayRef<Value> oPreRow = oPreRows[m];
      // Output row index: (p * M + m) * N + row for partials, m * N + row.
      Value outRowBase = e.constI64(m);
      if (partial)
        outRowBase = e.addI(e.mulI(e.blockY, e.constI64(M)), outRowBase);
      Value outRow = e.addI(e.mulI(outRowBase, N), row);
      if (partial) {
        storeRow(e, oPreRow, k.arg(out), outRow, f32, valid);
      } else {
        SmallVector<Value> oRow(oPreRow);
        if (norm) {
          Value rho = normFactor(e, normSums[m], D, spec.eps);
          ArrayRef<Value> weight = weights[spec.perQueryOutputNorm ? m : 0];
          oRow.clear();
          Value rhoV = e.splat(rho, layout.vectorWidth);
          for (int64_t c = 0; c < C; ++c)
            oRow.push_back(e.mul(e.mul(oPreRow[c], rhoV), weight[c]));
        }
        // The residual goes with the row o_pre is stored in: o itself
        // without an output norm.
        Value residual = residualOut >= 0 ? k.arg(residualOut) : Value();
        storeRow(e, oRow, k.arg(out), outRow, spec.output, valid,
                 oPre ? Value() : residual);
        if (oPre)
          storeRow(e, oPreRow, k.arg(oPreOut), outRow, spec.output, valid,
                   residual);
      }
      e.ifThen(writesLse,
               [&] { e.storeScalar(lses[m], k.arg(lseOut), outRow, f32); });
    }
  });
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = GridDimension{"N", 1, layout.rowsPerBlock};
  info.grid[1] = split ? GridDimension{"P", 1, 1} : GridDimension{"1", 1, 1};
  info.clusterY = clustered;
  info.grid[2] = {"1", 1, 1};
  return info;
}

//===----------------------------------------------------------------------===//
// merge
//===----------------------------------------------------------------------===//

KernelInfo mlir::attnres::gpu_kernels::emitMergeKernel(
    OpBuilder &b, Location loc, StringRef name, const MergeSpec &spec,
    RowLayout layout, const LaunchBody *into) {
  assert((!into || spec.columnTiles == 1) &&
         "a launch body takes whole rows, the ones it is given");
  KernelBuilder k(b, loc, name, "merge", into);
  Type f32 = b.getF32Type();
  // A row of D splits into T column tiles of W = D / T (no output norm):
  // the [P, rows, D] partials and [rows, D] outputs are then [P, rows * T,
  // W] and [rows * T, W], and tile row r belongs to row r / T.
  int64_t T = spec.columnTiles, D = spec.width, C = layout.chunks;
  assert(T == 1 || (!spec.outputNorm && layout.width * T == D));
  unsigned partials = k.buffer("partial_o", f32, "[P, rows, D]");
  unsigned partialLse = k.buffer("partial_lse", f32, "[P, rows]");
  int sink = spec.sink ? k.buffer("sink", f32, "[rows]") : -1;
  int weight = spec.outputNorm
                   ? k.buffer("output_norm", spec.outputNorm,
                              spec.perRowGroupWeight ? "[K, D]" : "[D]")
                   : -1;
  unsigned out = k.buffer("o", spec.output, "[rows, D]");
  unsigned lseOut = k.buffer("lse", f32, "[rows]");
  int oPreOut =
      spec.writeOPre ? k.buffer("o_pre", spec.output, "[rows, D]") : -1;
  int residualOut = spec.writeResidual ? k.buffer("o_pre_residual",
                                                  b.getI8Type(), "[rows, D/2]")
                                       : -1;
  unsigned rowsArg = k.scalar("num_rows");
  unsigned partitionsArg = k.scalar("num_partitions");
  int rowsPerWeight = spec.perRowGroupWeight ? k.scalar("rows_per_weight") : -1;

  bool unrolled =
      spec.staticPartitions > 0 && spec.staticPartitions <= kRegisterPartitions;
  int64_t weightTile =
      std::clamp<int64_t>(kWeightFloats / layout.rowsPerBlock, 1, 128);
  KernelEmitter e(b, loc, layout);
  e.planReductions(/*settled=*/1, /*loop=*/0);
  int64_t reduceFloats = e.reductionFloats();
  k.begin(
      layout.blockThreads(),
      std::max<int64_t>(
          1, reduceFloats + (unrolled ? 0 : layout.rowsPerBlock * weightTile)));
  e.setUpThreads(k.workgroup());
  if (into)
    e.setBlockRows(into->firstRow, into->rowCount);
  Value rows = k.arg(rowsArg), P = k.arg(partitionsArg);
  Value tileRows = e.mulI(rows, e.constI64(T));
  // The rows of the block, a step of rowsPerBlock rows at a time.
  e.forEachRowStep([&](Value row, Value inTile) {
    Value valid = e.lessThan(row, tileRows);
    if (inTile)
      valid = arith::AndIOp::create(b, loc, valid, inTile);
    Value rowc = e.minI(row, e.addI(tileRows, e.constI64(-1)));
    // The row of the lse, the sink and the weights.
    Value logicalRow = T > 1 ? e.divI(rowc, e.constI64(T)) : rowc;
    Value negInf = e.constF32(-kInf);
    Value zero = e.zeroVector();
    Value sinkLogit =
        sink >= 0 ? e.loadScalar(k.arg(sink), logicalRow, f32) : negInf;
    auto lseOf = [&](Value p) {
      return e.loadScalar(k.arg(partialLse),
                          e.addI(e.mulI(p, rows), logicalRow), f32);
    };
    Value maximum;
    auto weightOf = [&](Value x) { return partitionWeight(e, x, maximum); };
    // An empty partition's row may hold anything, NaN included: it is
    // selected away, never multiplied in.
    auto loadPartial = [&](Value p) {
      return loadRow(e, k.arg(partials), e.addI(e.mulI(p, tileRows), rowc),
                     f32);
    };
    auto accumulateRow = [&](ArrayRef<Value> acc, Value w,
                             ArrayRef<Value> part) {
      Value contributes =
          e.splat(e.greater(w, e.constF32(0.0)), layout.vectorWidth);
      Value wV = e.splat(w, layout.vectorWidth);
      SmallVector<Value> next;
      for (int64_t c = 0; c < C; ++c)
        next.push_back(
            e.add(acc[c], e.select(contributes, e.mul(part[c], wV), zero)));
      return next;
    };
    auto accumulate = [&](ArrayRef<Value> acc, Value w, Value p) {
      return accumulateRow(acc, w, loadPartial(p));
    };

    Value total;
    SmallVector<Value> acc(C, zero);
    if (unrolled) {
      // Few partitions: every lse in registers, every partial row load in
      // flight at once.
      SmallVector<Value> lse;
      maximum = sinkLogit;
      for (int64_t p = 0; p < spec.staticPartitions; ++p) {
        lse.push_back(lseOf(e.constI64(p)));
        maximum = e.maximum(maximum, lse.back());
      }
      total = sink >= 0 ? weightOf(sinkLogit) : e.constF32(0.0);
      for (int64_t p = 0; p < spec.staticPartitions; ++p) {
        Value w = weightOf(lse[p]);
        total = e.add(total, w);
        acc = accumulate(acc, w, e.constI64(p));
      }
    } else {
      // Many or run-time partitions: the lanes of a row split the lse work,
      // then stage the weights in workgroup memory a tile at a time.
      Value lane = e.lane, stride = e.constI64(layout.threadsPerRow);
      auto strided = [&](Value init, function_ref<Value(Value, Value)> body) {
        auto loop = scf::ForOp::create(
            b, loc, lane, P, stride, ValueRange{init},
            [&](OpBuilder &nested, Location, Value p, ValueRange carried) {
              OpBuilder::InsertionGuard guard(b);
              b.setInsertionPoint(nested.getInsertionBlock(),
                                  nested.getInsertionPoint());
              scf::YieldOp::create(b, loc, body(p, carried[0]));
            });
        return loop.getResult(0);
      };
      Value localMax = strided(
          negInf, [&](Value p, Value m) { return e.maximum(m, lseOf(p)); });
      maximum = e.maximum(e.rowMax({localMax})[0], sinkLogit);
      Value localSum = strided(e.constF32(0.0), [&](Value p, Value sum) {
        return e.add(sum, weightOf(lseOf(p)));
      });
      total = e.rowSum({localSum})[0];
      if (sink >= 0)
        total = e.add(total, weightOf(sinkLogit));

      Value tile = e.constI64(weightTile);
      Value weights = e.workgroupBuffer();
      Value rowBase = e.addI(e.constI64(reduceFloats), e.mulI(e.group, tile));
      auto slot = [&](Value p, Value tileStart) {
        return arith::IndexCastOp::create(
            b, loc, b.getIndexType(),
            e.addI(rowBase, arith::SubIOp::create(b, loc, p, tileStart)));
      };
      Carried init;
      init.add(acc);
      auto tiles = scf::ForOp::create(
          b, loc, e.constI64(0), e.ceilDivI(P, tile), e.constI64(1),
          init.values,
          [&](OpBuilder &nested, Location, Value t, ValueRange carried) {
            OpBuilder::InsertionGuard guard(b);
            b.setInsertionPoint(nested.getInsertionBlock(),
                                nested.getInsertionPoint());
            Value tileStart = e.mulI(t, tile);
            Value tileEnd = e.minI(e.addI(tileStart, tile), P);
            scf::ForOp::create(
                b, loc, e.addI(tileStart, lane), tileEnd, stride, ValueRange{},
                [&](OpBuilder &inner, Location, Value p, ValueRange) {
                  OpBuilder::InsertionGuard innerGuard(b);
                  b.setInsertionPoint(inner.getInsertionBlock(),
                                      inner.getInsertionPoint());
                  memref::StoreOp::create(b, loc, weightOf(lseOf(p)), weights,
                                          ValueRange{slot(p, tileStart)});
                  scf::YieldOp::create(b, loc);
                });
            gpu::BarrierOp::create(b, loc);
            // spec.loadsInFlight partitions a step: their rows are all
            // loaded before any is added, so that the step waits for one
            // load latency, not one per partition. Past the tile's end the
            // last partition is read again with weight 0.
            Value last = e.addI(tileEnd, e.constI64(-1));
            auto inner = scf::ForOp::create(
                b, loc, tileStart, tileEnd, e.constI64(spec.loadsInFlight),
                carried,
                [&](OpBuilder &innerBuilder, Location, Value p,
                    ValueRange partial) {
                  OpBuilder::InsertionGuard innerGuard(b);
                  b.setInsertionPoint(innerBuilder.getInsertionBlock(),
                                      innerBuilder.getInsertionPoint());
                  SmallVector<Value> ws;
                  SmallVector<SmallVector<Value>> rowsInFlight;
                  for (int64_t u = 0; u < spec.loadsInFlight; ++u) {
                    Value pu = e.addI(p, e.constI64(u));
                    Value inTile = e.lessThan(pu, tileEnd);
                    Value clamped = e.minI(pu, last);
                    Value w = memref::LoadOp::create(
                        b, loc, weights, ValueRange{slot(clamped, tileStart)});
                    ws.push_back(e.select(inTile, w, e.constF32(0.0)));
                    rowsInFlight.push_back(loadPartial(clamped));
                  }
                  SmallVector<Value> next(partial);
                  for (int64_t u = 0; u < spec.loadsInFlight; ++u)
                    next = accumulateRow(next, ws[u], rowsInFlight[u]);
                  scf::YieldOp::create(b, loc, next);
                });
            gpu::BarrierOp::create(b, loc);
            scf::YieldOp::create(b, loc, inner.getResults());
          });
      acc.assign(tiles.getResults().begin(), tiles.getResults().end());
    }
    Value anyMass = e.greater(total, e.constF32(0.0));
    SmallVector<Value> merged;
    Value inverse = e.div(e.constF32(1.0), total);
    for (int64_t c = 0; c < C; ++c)
      merged.push_back(
          e.select(e.splat(anyMass, layout.vectorWidth),
                   e.mul(acc[c], e.splat(inverse, layout.vectorWidth)), zero));
    Value lse = e.select(anyMass, e.add(maximum, e.log(total)), negInf);

    SmallVector<Value> oRow = merged;
    if (weight >= 0) {
      Value weightRow = e.constI64(0);
      if (rowsPerWeight >= 0)
        weightRow = e.divI(rowc, k.arg(rowsPerWeight));
      SmallVector<Value> h =
          loadRow(e, k.arg(weight), weightRow, spec.outputNorm);
      Value rho = normFactor(e, e.rowSum({dotChunks(e, merged, merged)})[0], D,
                             spec.eps);
      Value rhoV = e.splat(rho, layout.vectorWidth);
      oRow.clear();
      for (int64_t c = 0; c < C; ++c)
        oRow.push_back(e.mul(e.mul(merged[c], rhoV), h[c]));
    }
    Value residual = residualOut >= 0 ? k.arg(residualOut) : Value();
    storeRow(e, oRow, k.arg(out), row, spec.output, valid,
             oPreOut >= 0 ? Value() : residual);
    if (oPreOut >= 0)
      storeRow(e, merged, k.arg(oPreOut), row, spec.output, valid, residual);
    // Lane 0 of a row's first tile stores its lse.
    Value isLane0 = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                          e.lane, e.constI64(0));
    Value writesLse = arith::AndIOp::create(b, loc, valid, isLane0);
    if (T > 1)
      writesLse = arith::AndIOp::create(
          b, loc, writesLse,
          arith::CmpIOp::create(
              b, loc, arith::CmpIPredicate::eq,
              arith::RemUIOp::create(b, loc, rowc, e.constI64(T)),
              e.constI64(0)));
    e.ifThen(writesLse,
             [&] { e.storeScalar(lse, k.arg(lseOut), logicalRow, f32); });
  });
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = GridDimension{"rows", T, layout.rowsPerBlock};
  info.grid[1] = {"1", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}

//===----------------------------------------------------------------------===//
// backward
//===----------------------------------------------------------------------===//

namespace {
/// Chunk vectors of the query / weight gradients a backward thread carries.
int64_t partialValues(const AttnResSpec &spec, const RowLayout &layout) {
  int64_t weightRows = spec.perQueryOutputNorm ? spec.numQueries : 1;
  return (spec.numQueries + (spec.outputNorm ? weightRows : 0)) * layout.chunks;
}

/// Workgroup floats `combineRowGroups` needs for `values` chunk vectors a
/// thread.
int64_t combineFloats(const RowLayout &layout, int64_t values) {
  return (layout.rowsPerBlock - 1) * values * layout.threadsPerRow *
         layout.vectorWidth;
}

/// Workgroup bytes `combineRowGroups` takes at most.
constexpr int64_t kCombineBytes = 32 * 1024;

/// Chunk vectors a thread of each row group puts in workgroup memory at once
/// when the row groups add `values` of them: all of them where they fit in
/// kCombineBytes, else as many as do (at least one: a group's share of one
/// vector is at most a block of 1024 threads' vectors of 8 floats, 32 KiB).
int64_t combineRound(const RowLayout &layout, int64_t values) {
  int64_t perValue = combineFloats(layout, 1) * 4;
  if (perValue == 0)
    return values;
  return std::clamp<int64_t>(kCombineBytes / perValue, 1, values);
}
} // namespace

int64_t mlir::attnres::gpu_kernels::backwardPartialRowsPerBlock(
    const AttnResSpec &spec, const RowLayout &layout) {
  // The whole kernel's row groups add their partial rows in the block where
  // that takes one round of combineRowGroups (many queries with a per-query
  // output norm and small rows would need more: each group then writes its
  // own row, which the finalize adds).
  int64_t values = partialValues(spec, layout);
  if (layout.rowsPerBlock > 1 && combineRound(layout, values) == values)
    return 1;
  return layout.rowsPerBlock;
}

namespace {
/// The chunk vectors `values` of every row group of the block added in group
/// order (group 0's, then group 1's, ...) through workgroup memory, in rounds
/// of `round` vectors a thread; the totals are valid in group 0 (the others
/// add their own twice, and do not store). Lets a block write one partial
/// row of the query / weight gradients instead of one per row group: at
/// (L, N, D) = (4, 4096, 1024) (four groups of 32 lanes) the finalize read
/// 1056 partial rows of 4 KiB, 4.3 MB written and read again for an 84 MB
/// floor, and took 12 us of the backward's 37.
SmallVector<Value> combineRowGroups(KernelEmitter &e, ArrayRef<Value> values,
                                    Value workgroup, int64_t round) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  const RowLayout &layout = e.layout;
  int64_t lanes = layout.threadsPerRow, width = layout.vectorWidth;
  auto slot = [&](Value group, int64_t q) {
    // Group g > 0 keeps value q (of the round) of lane l at
    // ((g - 1) * round + q) * lanes + l vectors.
    Value vectorAt = e.addI(
        e.mulI(e.addI(e.mulI(e.addI(group, e.constI64(-1)), e.constI64(round)),
                      e.constI64(q)),
               e.constI64(lanes)),
        e.lane);
    return arith::IndexCastOp::create(b, loc, b.getIndexType(),
                                      e.mulI(vectorAt, e.constI64(width)));
  };
  llvm::MaybeAlign align(std::min<int64_t>(16, width * 4));
  SmallVector<Value> totals(values);
  int64_t count = values.size();
  for (int64_t first = 0; first < count; first += round) {
    int64_t last = std::min(count, first + round);
    // The walk's last row sums and staged rows, or the previous round's
    // values, may still be read.
    gpu::BarrierOp::create(b, loc);
    Value notFirst = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne,
                                           e.group, e.constI64(0));
    e.ifThen(notFirst, [&] {
      for (int64_t q = first; q < last; ++q)
        vector::StoreOp::create(b, loc, values[q], workgroup,
                                ValueRange{slot(e.group, q - first)},
                                /*nontemporal=*/false, align);
    });
    gpu::BarrierOp::create(b, loc);
    for (int64_t g = 1; g < layout.rowsPerBlock; ++g)
      for (int64_t q = first; q < last; ++q) {
        Value part =
            vector::LoadOp::create(b, loc, values[q].getType(), workgroup,
                                   ValueRange{slot(e.constI64(g), q - first)},
                                   /*nontemporal=*/false, align);
        totals[q] = e.add(totals[q], part);
      }
  }
  return totals;
}

/// Stores the key coordinates of a row's chunk vectors where `writer`
/// holds: row `row()` of a buffer of rows of R (whole vector rows where the
/// key is the row, R = D; else element by element, the key being the last R
/// coordinates).
void storeKeyRow(KernelEmitter &e, const AttnResSpec &spec,
                 ArrayRef<Value> chunks, ArrayRef<Value> keyMasks, Value base,
                 function_ref<Value()> row, Type element, Value writer) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  int64_t R = spec.rank, D = spec.width;
  if (R == D) {
    storeRow(e, chunks, base, row(), element, writer);
    return;
  }
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    for (int64_t j = 0; j < e.layout.vectorWidth; ++j) {
      Value isKey =
          vector::ExtractOp::create(b, loc, keyMasks[c], ArrayRef<int64_t>{j});
      e.ifThen(arith::AndIOp::create(b, loc, isKey, writer), [&] {
        Value d = vector::ExtractOp::create(b, loc, e.elementIndex[c],
                                            ArrayRef<int64_t>{j});
        Value r = arith::SubIOp::create(b, loc, d, e.constI64(D - R));
        Value index = e.addI(e.mulI(row(), e.constI64(R)), r);
        Value value =
            vector::ExtractOp::create(b, loc, chunks[c], ArrayRef<int64_t>{j});
        e.storeScalar(value, base, index, element);
      });
    }
  }
}
} // namespace

KernelInfo mlir::attnres::gpu_kernels::emitBackwardKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    RowLayout layout, SourceSchedule schedule, const LaunchBody *into) {
  KernelBuilder k(b, loc, name, "backward", into);
  int64_t L = spec.numSources, D = spec.width, R = spec.rank,
          M = spec.numQueries, C = layout.chunks;
  int64_t weightRows = spec.perQueryOutputNorm ? M : 1;
  Type f32 = b.getF32Type();
  unsigned sources = k.table("sources", spec.value, "L x [N, D]");
  unsigned query = queryBuffer(k, spec);
  int keyNorm = keyNormBuffer(k, spec);
  int outputNorm = spec.outputNorm
                       ? k.buffer("output_norm", spec.outputNorm,
                                  spec.perQueryOutputNorm ? "[M, D]" : "[D]")
                       : -1;
  unsigned grad = k.buffer("grad", spec.grad, "[M, N, D]");
  unsigned lseIn = k.buffer("lse", f32, "[M, N]");
  int saved = spec.saved ? k.buffer("saved", spec.saved, "[M, N, D]") : -1;
  int savedResidual = spec.readResidual ? k.buffer("saved_residual",
                                                   b.getI8Type(), "[M, N, D/2]")
                                        : -1;
  int gradLseIn = spec.readGradLse ? k.buffer("grad_lse", f32, "[M, N]") : -1;
  unsigned gradSources = k.table("grad_sources", spec.value, "L x [N, D]");
  // The whole kernel's blocks write partial rows of da (and dh) for its
  // finalize; a tile (a block of a split backward's loop) writes its own
  // rows of the partial gradients dq, dg and dh, which the loop's sums add.
  int partialDa = -1, partialDh = -1, tileDq = -1, tileDg = -1, tileDh = -1;
  if (!into) {
    partialDa =
        k.buffer("partial_da", f32, "[P * B * partial_rows_per_block, M, R]");
    partialDh = spec.outputNorm
                    ? k.buffer("partial_dh", f32,
                               spec.perQueryOutputNorm
                                   ? "[P * B * partial_rows_per_block, M, D]"
                                   : "[P * B * partial_rows_per_block, 1, D]")
                    : -1;
  } else {
    tileDq = k.buffer("dq", spec.gradQuery, "[tiles, M, R]");
    tileDg =
        spec.gradKeyNorm ? k.buffer("dg", spec.gradKeyNorm, "[tiles, R]") : -1;
    tileDh =
        spec.gradOutputNorm
            ? k.buffer("dh", spec.gradOutputNorm,
                       spec.perQueryOutputNorm ? "[tiles, M, D]" : "[tiles, D]")
            : -1;
  }
  unsigned tokens = k.scalar("num_tokens");
  int blocks = into ? -1 : k.scalar("num_blocks");
  int partitions = into ? -1 : k.scalar("num_partitions");

  KernelEmitter e(b, loc, layout);
  int64_t S = SourceWalker::batchFor(schedule, L);
  // Settled: the output norm's two sums and delta, M each; a loop batch:
  // every source's key sum of squares and its dot products with the M
  // queries and the M output gradients.
  e.planReductions(/*settled=*/2 * M, /*loop=*/S * (1 + 2 * M));
  int64_t values = partialValues(spec, layout);
  // A tile always adds its row groups' shares (it writes one row of each
  // partial gradient), in as many rounds as that takes; the whole kernel
  // where one round does.
  bool combine = layout.rowsPerBlock > 1 &&
                 (into || backwardPartialRowsPerBlock(spec, layout) == 1);
  int64_t round = combineRound(layout, values);
  k.begin(layout.blockThreads(),
          std::max(withStaging(schedule, e, layout, spec.value, L),
                   combine ? combineFloats(layout, round) : 0));
  e.setUpThreads(k.workgroup());
  Value N = k.arg(tokens);
  Value B = into ? Value() : k.arg(blocks);
  Value P = into ? Value() : k.arg(partitions);
  // The key coordinates of each chunk; the walks need them only when the
  // key is not the whole row.
  SmallVector<Value> allKeyMasks = e.keyMasks(R);
  SmallVector<Value> keyMasks;
  if (R < D)
    keyMasks = allKeyMasks;
  auto a = keyQuery(e, spec, k.arg(query),
                    keyNorm >= 0 ? k.arg(keyNorm) : Value(), allKeyMasks);

  // The tokens of this block (blockIdx.x; a tile's rows) and the trips
  // every row group makes over them; the sources of its partition
  // (blockIdx.y; a tile walks them all).
  Value G = e.constI64(layout.rowsPerBlock);
  Value start, stop, trips;
  if (into) {
    start = into->firstRow;
    stop = e.addI(start, into->rowCount);
    trips = e.ceilDivI(into->rowCount, G);
  } else {
    Value chunk = e.ceilDivI(N, B);
    start = e.minI(e.mulI(e.blockX, chunk), N);
    stop = e.minI(e.addI(start, chunk), N);
    trips = e.ceilDivI(chunk, G);
  }
  Value lastRow = e.addI(N, e.constI64(-1));
  Value sourceBegin, sourceEnd;
  if (into) {
    sourceBegin = e.constI64(0);
    sourceEnd = e.constI64(L);
  } else {
    sourceBegin = e.divI(e.mulI(e.blockY, e.constI64(L)), P);
    sourceEnd =
        e.divI(e.mulI(e.addI(e.blockY, e.constI64(1)), e.constI64(L)), P);
  }
  int64_t width = layout.vectorWidth;
  Value zero = e.zeroVector();
  Value zeroF = e.constF32(0.0);

  Carried init;
  unsigned daAt = init.add(SmallVector<Value>(M * C, zero));
  unsigned dhAt =
      init.add(SmallVector<Value>(outputNorm >= 0 ? weightRows * C : 0, zero));
  auto rows = scf::ForOp::create(
      b, loc, e.constI64(0), trips, e.constI64(1), init.values,
      [&](OpBuilder &nested, Location, Value trip, ValueRange carried) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nested.getInsertionBlock(),
                            nested.getInsertionPoint());
        Value row = e.addI(e.addI(start, e.mulI(trip, G)), e.group);
        Value valid = e.lessThan(row, stop);
        Value rowc = e.minI(row, lastRow);
        SourceWalker walker(e, k.arg(sources), spec.value, rowc, L, schedule);
        // The walk's first loads go out now, to be in flight while delta is
        // formed (with the recompute, after the recompute's walk).
        SmallVector<Value> started;
        if (saved >= 0)
          started = walker.start(sourceBegin, sourceEnd);

        SmallVector<Value> lse;
        SmallVector<SmallVector<Value>> dOut, oPre;
        for (int64_t m = 0; m < M; ++m) {
          Value perQueryRow = e.addI(e.mulI(e.constI64(m), N), rowc);
          lse.push_back(e.loadScalar(k.arg(lseIn), perQueryRow, f32));
          dOut.push_back(loadRow(e, k.arg(grad), perQueryRow, spec.grad));
          if (saved >= 0)
            oPre.push_back(loadRow(e, k.arg(saved), perQueryRow, spec.saved));
          if (savedResidual >= 0)
            oPre.back() = decodeResidualRow(
                e, oPre.back(), k.arg(savedResidual), perQueryRow, spec.saved);
        }
        if (saved < 0) {
          // Recompute o_pre = sum_s p_s v_s with p_s = exp(z_s - lse). The
          // barrier keeps this walk's first row sums off the workgroup half
          // the previous row's last batch may still be reading.
          gpu::BarrierOp::create(b, loc);
          auto recomputeStep = [&](ArrayRef<SourceSlot> slots, ValueRange acc,
                                   Value half, bool first) {
            BatchSums sums = sumBatch(e, spec, slots, a, {}, keyMasks, half);
            SmallVector<Value> next(acc);
            for (auto [i, slot] : llvm::enumerate(slots)) {
              for (int64_t m = 0; m < M; ++m) {
                Value p = weightOf(e, spec, sums.ell[i][m], lse[m]);
                if (slot.valid)
                  p = e.select(slot.valid, p, zeroF);
                Value pV = e.splat(p, width);
                SmallVector<Value> row = rowAgain(e, slot);
                for (int64_t c = 0; c < C; ++c)
                  next[m * C + c] = e.add(next[m * C + c], e.mul(row[c], pV));
              }
            }
            return next;
          };
          SmallVector<Value> acc =
              walker.all(SmallVector<Value>(M * C, zero), recomputeStep);
          for (int64_t m = 0; m < M; ++m)
            oPre.push_back(SmallVector<Value>(acc.begin() + m * C,
                                              acc.begin() + (m + 1) * C));
        }

        // do_pre, through the output norm when there is one.
        SmallVector<SmallVector<Value>> dPre = dOut;
        SmallVector<Value> dh(carried.begin() + dhAt,
                              carried.begin() + dhAt +
                                  (outputNorm >= 0 ? weightRows * C : 0));
        if (outputNorm >= 0) {
          // The weight rows are read per row (cached), not held in registers
          // across the walk over the sources.
          SmallVector<SmallVector<Value>> weights =
              loadWeightRows(e, k.arg(outputNorm), spec.outputNorm, weightRows);
          SmallVector<Value> squares;
          for (int64_t m = 0; m < M; ++m)
            squares.push_back(dotChunks(e, oPre[m], oPre[m]));
          SmallVector<Value> squareSums = e.rowSum(squares);
          SmallVector<Value> rhos;
          SmallVector<SmallVector<Value>> xhat;
          SmallVector<Value> meanTerms;
          for (int64_t m = 0; m < M; ++m) {
            rhos.push_back(normFactor(e, squareSums[m], D, spec.eps));
            xhat.push_back(scaleChunks(e, oPre[m], rhos[m]));
            ArrayRef<Value> h = weights[spec.perQueryOutputNorm ? m : 0];
            Value term = zeroF;
            for (int64_t c = 0; c < C; ++c)
              term = e.add(term, e.sumVector(e.mul(e.mul(xhat[m][c], h[c]),
                                                   dOut[m][c])));
            meanTerms.push_back(term);
          }
          SmallVector<Value> meanSums = e.rowSum(meanTerms);
          Value validV = e.splat(valid, width);
          for (int64_t m = 0; m < M; ++m) {
            ArrayRef<Value> h = weights[spec.perQueryOutputNorm ? m : 0];
            Value meanV = e.splat(
                e.div(meanSums[m], e.constF32(static_cast<double>(D))), width);
            Value rhoV = e.splat(rhos[m], width);
            int64_t weightRow = spec.perQueryOutputNorm ? m : 0;
            for (int64_t c = 0; c < C; ++c) {
              dPre[m][c] = e.mul(rhoV, e.sub(e.mul(h[c], dOut[m][c]),
                                             e.mul(xhat[m][c], meanV)));
              // dh is a token reduction: every source partition computes
              // it, the first one keeps it.
              Value contribution = e.mul(xhat[m][c], dOut[m][c]);
              dh[weightRow * C + c] = e.add(
                  dh[weightRow * C + c], e.select(validV, contribution, zero));
            }
          }
        }
        if (saved < 0)
          started = walker.start(sourceBegin, sourceEnd);
        SmallVector<Value> deltaTerms;
        for (int64_t m = 0; m < M; ++m)
          deltaTerms.push_back(dotChunks(e, dPre[m], oPre[m]));
        SmallVector<Value> delta = e.rowSum(deltaTerms);
        // The lse's gradient adds scale * p_s * dlse to each logit's.
        if (gradLseIn >= 0)
          for (int64_t m = 0; m < M; ++m) {
            Value perQueryRow = e.addI(e.mulI(e.constI64(m), N), rowc);
            Value dlse = e.loadScalar(k.arg(gradLseIn), perQueryRow, f32);
            delta[m] = e.sub(delta[m], dlse);
          }

        // One pass over the partition's sources: dv, and the block's share
        // of da.
        auto sourceStep = [&](ArrayRef<SourceSlot> slots, ValueRange da,
                              Value half, bool first) {
          // The gradients' rows are addressed before the row sums, so the
          // table loads are done by the time the stores need them.
          SmallVector<Value> targets;
          for (const SourceSlot &slot : slots)
            targets.push_back(e.loadPointer(
                k.arg(gradSources), e.minI(slot.index, e.constI64(L - 1))));
          BatchSums sums = sumBatch(e, spec, slots, a, dPre, keyMasks, half);
          SmallVector<Value> next(da);
          for (auto [i, slot] : llvm::enumerate(slots)) {
            Value rho = sums.rho[i];
            Value writes =
                slot.valid ? arith::AndIOp::create(b, loc, valid, slot.valid)
                                 .getResult()
                           : valid;
            SmallVector<Value> dv(C, zero), keyTerm(C, zero);
            SmallVector<Value> row = rowAgain(e, slot);
            for (int64_t m = 0; m < M; ++m) {
              Value ell = sums.ell[i][m];
              Value p = weightOf(e, spec, ell, lse[m]);
              Value ds = e.mul(e.constF32(spec.scale),
                               e.mul(p, e.sub(sums.extra[i][m], delta[m])));
              Value dsRho = e.mul(ds, rho);
              Value pV = e.splat(p, width);
              Value dsRhoV = e.splat(dsRho, width);
              Value correction = e.splat(
                  e.div(e.mul(rho, ell), e.constF32(static_cast<double>(R))),
                  width);
              for (int64_t c = 0; c < C; ++c) {
                dv[c] = e.add(dv[c], e.mul(pV, dPre[m][c]));
                keyTerm[c] = e.add(
                    keyTerm[c],
                    e.mul(dsRhoV, e.sub(a[m][c], e.mul(correction, row[c]))));
              }
              // da = sum ds * khat over the rows and sources this block
              // owns; only its key coordinates are stored.
              Value dsRhoV2 = e.splat(e.select(writes, dsRho, zeroF), width);
              for (int64_t c = 0; c < C; ++c)
                next[m * C + c] =
                    e.add(next[m * C + c], e.mul(dsRhoV2, row[c]));
            }
            for (int64_t c = 0; c < C; ++c)
              dv[c] =
                  e.add(dv[c], keyMasks.empty()
                                   ? keyTerm[c]
                                   : e.select(keyMasks[c], keyTerm[c], zero));
            // An accumulating backward adds the gradient the row already
            // has (each row of each source is this thread's alone), in
            // FP32, and rounds once, except (with write-tags) into an entry
            // tagged in bit 0, which it writes over (a source whose
            // gradient starts here, with no zeros to read). A null entry
            // of the gradient table asks for no gradient of that source:
            // its row is neither read nor written (the source still counts
            // in dq, dg and dh).
            auto [target, overwrite] =
                spec.writeTags ? e.splitWriteTag(targets[i])
                               : std::pair<Value, Value>(targets[i], {});
            Value wanted =
                arith::AndIOp::create(b, loc, writes, e.notNull(target));
            storeRow(e, dv, target, rowc, spec.value, wanted, {},
                     spec.accumulate, overwrite);
          }
          return next;
        };
        SmallVector<Value> da =
            walker.range(sourceBegin, sourceEnd, carried.take_front(M * C),
                         sourceStep, started);
        SmallVector<Value> next(da);
        llvm::append_range(next, dh);
        scf::YieldOp::create(b, loc, next);
      });

  // The block's partial rows: its share of da (key coordinates) and of dh
  // (partition 0's; zero from the others), its row groups added first into
  // one row (a tile's always, the whole kernel's where
  // backwardPartialRowsPerBlock says so), else one row each.
  SmallVector<Value> partials;
  for (int64_t i = 0; i < values; ++i)
    partials.push_back(rows.getResult(daAt + i));
  assert(dhAt == daAt + M * C && "dh follows da in the carried values");
  Value writer,
      partialRow = into ? into->tileRow : e.addI(e.mulI(e.blockY, B), e.blockX);
  if (combine) {
    partials = combineRowGroups(e, partials, k.workgroup(), round);
    writer = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, e.group,
                                   e.constI64(0));
  } else {
    writer = arith::ConstantOp::create(b, loc, b.getBoolAttr(true));
    if (!into)
      partialRow = e.addI(e.mulI(partialRow, G), e.group);
  }
  auto queryRow = [&](int64_t m) {
    return [&, m] {
      return e.addI(e.mulI(partialRow, e.constI64(M)), e.constI64(m));
    };
  };
  if (into) {
    // The tile's share of the gradients: dq[m] = da[m] * g over the key
    // coordinates, dg = sum_m da[m] * q[m], dh as the rows left it.
    SmallVector<Value> g;
    if (keyNorm >= 0)
      g = keyQuery(e, spec, k.arg(keyNorm), Value(), allKeyMasks, spec.keyNorm,
                   1)
              .front();
    SmallVector<SmallVector<Value>> q;
    if (tileDg >= 0)
      q = keyQuery(e, spec, k.arg(query), Value(), allKeyMasks, spec.query, M);
    SmallVector<Value> dg(C, zero);
    for (int64_t m = 0; m < M; ++m) {
      SmallVector<Value> dq;
      for (int64_t c = 0; c < C; ++c) {
        Value da = partials[m * C + c];
        dq.push_back(g.empty() ? da : e.mul(da, g[c]));
        if (tileDg >= 0)
          dg[c] = e.add(dg[c], e.mul(da, q[m][c]));
      }
      storeKeyRow(e, spec, dq, allKeyMasks, k.arg(tileDq), queryRow(m),
                  spec.gradQuery, writer);
    }
    if (tileDg >= 0)
      storeKeyRow(
          e, spec, dg, allKeyMasks, k.arg(tileDg), [&] { return partialRow; },
          spec.gradKeyNorm, writer);
    for (int64_t w = 0; tileDh >= 0 && w < weightRows; ++w) {
      Value outRow =
          e.addI(e.mulI(partialRow, e.constI64(weightRows)), e.constI64(w));
      storeRow(e, ArrayRef<Value>(partials).slice(M * C + w * C, C),
               k.arg(tileDh), outRow, spec.gradOutputNorm, writer);
    }
    KernelInfo info = k.finish();
    info.vectorWidth = layout.vectorWidth;
    return info;
  }
  for (int64_t m = 0; m < M; ++m)
    storeKeyRow(e, spec, ArrayRef<Value>(partials).slice(m * C, C), keyMasks,
                k.arg(partialDa), queryRow(m), f32, writer);
  if (partialDh >= 0) {
    Value firstPartition = arith::CmpIOp::create(
        b, loc, arith::CmpIPredicate::eq, e.blockY, e.constI64(0));
    Value keep = e.splat(firstPartition, width);
    for (int64_t w = 0; w < weightRows; ++w) {
      SmallVector<Value> dh;
      for (int64_t c = 0; c < C; ++c)
        dh.push_back(e.select(keep, partials[M * C + w * C + c], zero));
      Value outRow =
          e.addI(e.mulI(partialRow, e.constI64(weightRows)), e.constI64(w));
      storeRow(e, dh, k.arg(partialDh), outRow, f32, writer);
    }
  }
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = {"B", 1, 1};
  info.grid[1] = {"P", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}

//===----------------------------------------------------------------------===//
// finalize and sum
//===----------------------------------------------------------------------===//

namespace {
/// The flat thread index of a one-dimensional grid.
Value globalThread(KernelEmitter &e, int64_t threads) {
  Value tid = e.toI64(gpu::ThreadIdOp::create(e.b, e.loc, gpu::Dimension::x));
  Value block = e.toI64(gpu::BlockIdOp::create(e.b, e.loc, gpu::Dimension::x));
  return e.addI(e.mulI(block, e.constI64(threads)), tid);
}

/// sum_{k < count} load(base, k * stride + offset), in order.
Value sumStrided(KernelEmitter &e, Value base, Value count, Value stride,
                 Value offset) {
  auto loop = scf::ForOp::create(
      e.b, e.loc, e.constI64(0), count, e.constI64(1),
      ValueRange{e.constF32(0.0)},
      [&](OpBuilder &nested, Location, Value k, ValueRange carried) {
        OpBuilder::InsertionGuard guard(e.b);
        e.b.setInsertionPoint(nested.getInsertionBlock(),
                              nested.getInsertionPoint());
        Value x = e.loadScalar(base, e.addI(e.mulI(k, stride), offset),
                               e.b.getF32Type());
        scf::YieldOp::create(e.b, e.loc, e.add(carried[0], x));
      });
  return loop.getResult(0);
}
} // namespace

namespace {
/// Column sums of K partial rows, split over the subgroups of a block: lane
/// l of every subgroup owns column `column`; subgroup w adds rows
/// [w * K / W, (w + 1) * K / W) in order, `unroll` loads in flight, and the
/// W partial sums are added in subgroup order through workgroup memory.
/// Element (k, v) of the column is at k * rowStride + v * valueStride +
/// column. The totals (one per v) are valid in subgroup 0.
SmallVector<Value> sumColumns(KernelEmitter &e, Value base, Value K,
                              int64_t rowStride, int64_t values,
                              int64_t valueStride, Value column, Value inRange,
                              Value workgroup, int64_t subgroups, Value lane,
                              Value subgroup) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  // The partial rows are many and short, so the sum waits on latency:
  // 16 loads in flight a lane took the decode finalize from 8.1 to 5.8 us
  // (64, 128, 4096) and 4.7 to 3.8 us (32, 16, 8192) against 4.
  constexpr int64_t unroll = 16;
  Type f32 = b.getF32Type();
  Value segment = e.ceilDivI(K, e.constI64(subgroups));
  Value first = e.minI(e.mulI(subgroup, segment), K);
  Value last = e.minI(e.addI(first, segment), K);
  Value safeColumn = e.select(inRange, column, e.constI64(0));
  auto loop = scf::ForOp::create(
      b, loc, first, last, e.constI64(unroll),
      SmallVector<Value>(values, e.constF32(0.0)),
      [&](OpBuilder &nested, Location, Value k, ValueRange carried) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nested.getInsertionBlock(),
                            nested.getInsertionPoint());
        SmallVector<SmallVector<Value>> loaded(unroll);
        for (int64_t u = 0; u < unroll; ++u) {
          Value index = e.addI(k, e.constI64(u));
          Value present = e.lessThan(index, last);
          Value row = e.minI(index, e.addI(last, e.constI64(-1)));
          for (int64_t v = 0; v < values; ++v) {
            Value x =
                e.loadScalar(base,
                             e.addI(e.addI(e.mulI(row, e.constI64(rowStride)),
                                           e.constI64(v * valueStride)),
                                    safeColumn),
                             f32);
            loaded[u].push_back(e.select(present, x, e.constF32(0.0)));
          }
        }
        SmallVector<Value> next(carried);
        for (int64_t u = 0; u < unroll; ++u)
          for (int64_t v = 0; v < values; ++v)
            next[v] = e.add(next[v], loaded[u][v]);
        scf::YieldOp::create(b, loc, next);
      });
  int64_t lanes = e.layout.subgroupSize;
  auto slot = [&](Value w, int64_t v) {
    return arith::IndexCastOp::create(
        b, loc, b.getIndexType(),
        e.addI(e.mulI(e.addI(e.mulI(w, e.constI64(values)), e.constI64(v)),
                      e.constI64(lanes)),
               lane));
  };
  for (int64_t v = 0; v < values; ++v)
    memref::StoreOp::create(b, loc, loop.getResult(v), workgroup,
                            ValueRange{slot(subgroup, v)});
  gpu::BarrierOp::create(b, loc);
  SmallVector<Value> totals;
  for (int64_t v = 0; v < values; ++v) {
    Value total;
    for (int64_t w = 0; w < subgroups; ++w) {
      Value part = memref::LoadOp::create(b, loc, workgroup,
                                          ValueRange{slot(e.constI64(w), v)});
      total = total ? e.add(total, part) : part;
    }
    totals.push_back(total);
  }
  return totals;
}
} // namespace

KernelInfo mlir::attnres::gpu_kernels::emitFinalizeKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    int64_t threads, int64_t subgroupSize, int64_t maxThreads) {
  KernelBuilder k(b, loc, name, "finalize");
  int64_t M = spec.numQueries, R = spec.rank, D = spec.width;
  int64_t weightRows = spec.perQueryOutputNorm ? M : 1;
  Type f32 = b.getF32Type();
  unsigned partialDa = k.buffer("partial_da", f32, "[K, M, R]");
  int partialDh =
      spec.outputNorm
          ? k.buffer("partial_dh", f32,
                     spec.perQueryOutputNorm ? "[K, M, D]" : "[K, 1, D]")
          : -1;
  unsigned query = k.buffer("query", spec.query, "[M, R]");
  int keyNorm = spec.keyNorm ? k.buffer("key_norm", spec.keyNorm, "[R]") : -1;
  unsigned dq = k.buffer("dq", spec.gradQuery, "[M, R]");
  int dg = spec.keyNorm ? k.buffer("dg", spec.gradKeyNorm, "[R]") : -1;
  int dh = spec.outputNorm
               ? k.buffer("dh", spec.gradOutputNorm,
                          spec.perQueryOutputNorm ? "[M, D]" : "[D]")
               : -1;
  unsigned partialRows = k.scalar("num_partial_rows");

  // A block: `subgroupSize` columns, its subgroups splitting the rows.
  RowLayout flat;
  flat.subgroupSize = subgroupSize;
  KernelEmitter e(b, loc, flat);
  int64_t daTiles = llvm::divideCeil(R, subgroupSize);
  int64_t dhColumns = dh >= 0 ? weightRows * D : 0;
  int64_t dhTiles = llvm::divideCeil(dhColumns, subgroupSize);
  // The sum waits on latency, so what matters is how few rows each
  // subgroup walks: about 2048 subgroups over the grid, 8 to 16 a block.
  // H200, against 8 for all: 16 took the backward from 36.8 to 34.8 us at
  // (L, N, D) = (4, 4096, 1024) and from 175.3 to 173.4 us at
  // (8, 8192, 2048); at (32, 16, 8192) (256 tiles) 16 took 15.0 us against
  // 14.4 (benchmarks/kernels.py, reduction-threads=256/512).
  int64_t subgroups =
      threads > 0
          ? std::max<int64_t>(1, threads / subgroupSize)
          : std::min(std::clamp<int64_t>(
                         llvm::divideCeil(2048, daTiles + dhTiles), 8, 16),
                     std::max<int64_t>(1, maxThreads / subgroupSize));
  k.begin(subgroups * subgroupSize,
          subgroups * std::max<int64_t>(M, 1) * subgroupSize);
  Value K = k.arg(partialRows);
  Value tid = e.toI64(gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x));
  Value tile = e.toI64(gpu::BlockIdOp::create(b, loc, gpu::Dimension::x));
  Value lane = arith::RemUIOp::create(b, loc, tid, e.constI64(subgroupSize));
  Value subgroup = e.divI(tid, e.constI64(subgroupSize));
  Value firstSubgroup = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                              subgroup, e.constI64(0));
  Value isDa = e.lessThan(tile, e.constI64(daTiles));

  auto daThen = [&] {
    // dq[m][r] = da[m][r] * g[r]; dg[r] = sum_m da[m][r] * q[m][r].
    Value r = e.addI(e.mulI(tile, e.constI64(subgroupSize)), lane);
    Value inRange = e.lessThan(r, e.constI64(R));
    SmallVector<Value> da =
        sumColumns(e, k.arg(partialDa), K, M * R, M, R, r, inRange,
                   k.workgroup(), subgroups, lane, subgroup);
    e.ifThen(arith::AndIOp::create(b, loc, firstSubgroup, inRange), [&] {
      Value g = keyNorm >= 0 ? e.loadScalar(k.arg(keyNorm), r, spec.keyNorm)
                             : Value();
      Value dgSum = e.constF32(0.0);
      for (int64_t m = 0; m < M; ++m) {
        Value index = e.addI(e.constI64(m * R), r);
        e.storeScalar(g ? e.mul(da[m], g) : da[m], k.arg(dq), index,
                      spec.gradQuery);
        if (dg >= 0)
          dgSum = e.add(dgSum, e.mul(da[m], e.loadScalar(k.arg(query), index,
                                                         spec.query)));
      }
      if (dg >= 0)
        e.storeScalar(dgSum, k.arg(dg), r, spec.gradKeyNorm);
    });
  };
  if (dhTiles == 0) {
    daThen();
  } else {
    auto branch = scf::IfOp::create(b, loc, isDa, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(branch.thenBlock());
      daThen();
      b.setInsertionPointToStart(branch.elseBlock());
      Value j = e.addI(
          e.mulI(e.addI(tile, e.constI64(-daTiles)), e.constI64(subgroupSize)),
          lane);
      Value inRange = e.lessThan(j, e.constI64(dhColumns));
      SmallVector<Value> total =
          sumColumns(e, k.arg(partialDh), K, dhColumns, 1, 0, j, inRange,
                     k.workgroup(), subgroups, lane, subgroup);
      e.ifThen(arith::AndIOp::create(b, loc, firstSubgroup, inRange), [&] {
        e.storeScalar(total[0], k.arg(dh), j, spec.gradOutputNorm);
      });
    }
  }
  KernelInfo info = k.finish();
  info.grid[0] = {"1", daTiles + dhTiles, 1};
  info.grid[1] = {"1", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}

KernelInfo mlir::attnres::gpu_kernels::emitSumKernel(OpBuilder &b, Location loc,
                                                     StringRef name,
                                                     int64_t partitions,
                                                     Type output,
                                                     int64_t threads) {
  KernelBuilder k(b, loc, name, "sum");
  Type f32 = b.getF32Type();
  unsigned partials = k.buffer("partials", f32, "[P, S]");
  unsigned out = k.buffer("output", output, "[S]");
  unsigned size = k.scalar("num_elements");
  RowLayout flat;
  KernelEmitter e(b, loc, flat);
  k.begin(threads, 1);
  Value S = k.arg(size);
  Value index = globalThread(e, threads);
  e.ifThen(e.lessThan(index, S), [&] {
    Value value =
        sumStrided(e, k.arg(partials), e.constI64(partitions), S, index);
    e.storeScalar(value, k.arg(out), index, output);
  });
  KernelInfo info = k.finish();
  info.grid[0] = {"N", 1, threads};
  info.grid[1] = {"1", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}
