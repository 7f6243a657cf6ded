//===- Kernels.cpp - the attnres GPU kernels ------------------------------===//
//
// forward:  one pass over the sources with an online softmax per query: for
//           each source, one row sum gives the key's mean square and its dot
//           products with every query, then the running maximum, weight sum
//           and FP32 output rows are rescaled and updated in registers.
// partial:  the same over the sources of partition blockIdx.y, writing FP32
//           partial outputs and their lse for the merge.
// merge:    the softmax merge of P partial rows (empty partitions skipped,
//           optional sink), with the optional output norm.
// backward: blocks of tokens; per row, delta = <do_pre, o_pre> first (from
//           the saved o_pre, or recomputed), then one pass over the sources
//           that writes dv and accumulates the query and output-norm
//           gradients of the block in registers, stored once per block as
//           FP32 partial rows.
// finalize: the partial rows summed in block order: dq, dg, dh.
// sum:      partition_reduce sum.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <limits>

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;

std::string mlir::attnres::gpu_kernels::typeName(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// A kernel under construction: its arguments, declared by name, and its
/// body.
class KernelBuilder {
public:
  KernelBuilder(OpBuilder &b, Location loc, StringRef name, StringRef role)
      : b(b), loc(loc) {
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

  /// Creates the gpu.func with a workgroup buffer of `workgroupFloats`
  /// floats and leaves `b` at the start of its body.
  gpu::GPUFuncOp begin(int64_t blockThreads, int64_t workgroupFloats) {
    info.blockThreads = blockThreads;
    info.workgroupBytes = workgroupFloats * 4;
    auto workgroupType = MemRefType::get(
        {workgroupFloats}, b.getF32Type(), MemRefLayoutAttrInterface(),
        gpu::AddressSpaceAttr::get(b.getContext(),
                                   gpu::AddressSpace::Workgroup));
    func =
        gpu::GPUFuncOp::create(b, loc, info.name, b.getFunctionType(types, {}),
                               TypeRange{workgroupType});
    func->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
    func.setKnownBlockSizeAttr(
        b.getDenseI32ArrayAttr({static_cast<int32_t>(blockThreads), 1, 1}));
    b.setInsertionPointToStart(&func.getBody().front());
    return func;
  }
  Value arg(unsigned index) { return func.getArgument(index); }
  Value workgroup() { return func.getWorkgroupAttributions().front(); }
  KernelInfo finish() {
    gpu::ReturnOp::create(b, loc);
    b.setInsertionPointAfter(func);
    return info;
  }

  OpBuilder &b;
  Location loc;
  KernelInfo info;

private:
  SmallVector<Type> types;
  gpu::GPUFuncOp func;
};

/// `a[m][c]`: the chunk vectors of g * q[m] laid over the key coordinates of
/// a row (zero elsewhere).
SmallVector<SmallVector<Value>> keyQuery(KernelEmitter &e,
                                         const AttnResSpec &spec, Value query,
                                         Value keyNorm,
                                         ArrayRef<Value> keyMasks) {
  OpBuilder &b = e.b;
  int64_t width = e.layout.vectorWidth;
  int64_t keyStart = spec.width - spec.rank;
  SmallVector<SmallVector<Value>> a(spec.numQueries);
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
    for (int64_t m = 0; m < spec.numQueries; ++m) {
      Value vector = e.zeroVector();
      for (int64_t j = 0; j < width; ++j) {
        Value r = coordinates[j];
        Value element = e.loadScalar(
            query, e.addI(e.constI64(m * spec.rank), r), spec.query);
        if (keyNorm)
          element = e.mul(element, e.loadScalar(keyNorm, r, spec.keyNorm));
        vector = vector::InsertOp::create(b, e.loc, element, vector,
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

/// Stores the chunk vectors of a row where `valid` (i1) holds.
void storeRow(KernelEmitter &e, ArrayRef<Value> chunks, Value base, Value row,
              Type element, Value valid) {
  Value rowStart = e.mulI(row, e.constI64(e.layout.width));
  for (int64_t c = 0; c < e.layout.chunks; ++c) {
    Value inRow = arith::AndIOp::create(e.b, e.loc, valid, e.chunkActive[c]);
    e.ifThen(inRow, [&] {
      Value index = e.addI(
          rowStart, e.mulI(e.vectorIndex[c], e.constI64(e.layout.vectorWidth)));
      e.storeVector(chunks[c], base, index, element);
    });
  }
}

/// The row of source `index` (clamped into [0, L)) of the table: what a
/// source loop prefetches one iteration ahead, so that a load is always in
/// flight while the row sums of the current source wait on each other.
SmallVector<Value> loadSourceRow(KernelEmitter &e, Value table, Value index,
                                 int64_t numSources, Value row, Type element) {
  Value clamped = e.minI(index, e.constI64(numSources - 1));
  return loadRow(e, e.loadPointer(table, clamped), row, element);
}

Value dotChunks(KernelEmitter &e, ArrayRef<Value> x, ArrayRef<Value> y) {
  Value total = e.constF32(0.0);
  for (auto [u, v] : llvm::zip(x, y))
    total = e.add(total, e.sumVector(e.mul(u, v)));
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

} // namespace

//===----------------------------------------------------------------------===//
// forward and partial forward
//===----------------------------------------------------------------------===//

KernelInfo mlir::attnres::gpu_kernels::emitForwardKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    RowLayout layout, bool partial) {
  KernelBuilder k(b, loc, name, partial ? "forward_partial" : "forward");
  int64_t L = spec.numSources, D = spec.width, R = spec.rank,
          M = spec.numQueries, C = layout.chunks;
  Type f32 = b.getF32Type();
  unsigned sources = k.table("sources", spec.value, "L x [N, D]");
  unsigned query = k.buffer("query", spec.query, "[M, R]");
  int keyNorm = spec.keyNorm ? k.buffer("key_norm", spec.keyNorm, "[R]") : -1;
  bool norm = spec.outputNorm && !partial;
  int outputNorm = norm ? k.buffer("output_norm", spec.outputNorm,
                                   spec.perQueryOutputNorm ? "[M, D]" : "[D]")
                        : -1;
  unsigned out = partial ? k.buffer("partial_o", f32, "[P, M, N, D]")
                         : k.buffer("o", spec.output, "[M, N, D]");
  unsigned lseOut = partial ? k.buffer("partial_lse", f32, "[P, M, N]")
                            : k.buffer("lse", f32, "[M, N]");
  bool oPre = !partial && spec.writeOPre;
  int oPreOut = oPre ? k.buffer("o_pre", spec.output, "[M, N, D]") : -1;
  unsigned tokens = k.scalar("num_tokens");
  int partitions = partial ? k.scalar("num_partitions") : -1;

  KernelEmitter e(b, loc, layout);
  k.begin(layout.blockThreads(), e.workgroupFloats(1 + M));
  e.setUpThreads(k.workgroup());
  Value N = k.arg(tokens);
  Value row =
      e.addI(e.mulI(e.blockX, e.constI64(layout.rowsPerBlock)), e.group);
  Value valid = e.lessThan(row, N);
  Value rowc = e.minI(row, e.addI(N, e.constI64(-1)));
  SmallVector<Value> keyMasks = e.keyMasks(R);
  auto a = keyQuery(e, spec, k.arg(query),
                    keyNorm >= 0 ? k.arg(keyNorm) : Value(), keyMasks);

  // The sources of this block: all of them, or partition blockIdx.y.
  Value begin = e.constI64(0), end = e.constI64(L);
  if (partial) {
    Value P = k.arg(partitions);
    begin = e.divI(e.mulI(e.blockY, e.constI64(L)), P);
    end = e.divI(e.mulI(e.addI(e.blockY, e.constI64(1)), e.constI64(L)), P);
  }

  Carried init;
  unsigned maxAt = init.add(SmallVector<Value>(M, e.constF32(-kInf)));
  unsigned sumAt = init.add(SmallVector<Value>(M, e.constF32(0.0)));
  unsigned accAt = init.add(SmallVector<Value>(M * C, e.zeroVector()));
  unsigned rowAt =
      init.add(loadSourceRow(e, k.arg(sources), begin, L, rowc, spec.value));
  auto loop = scf::ForOp::create(
      b, loc, begin, end, e.constI64(1), init.values,
      [&](OpBuilder &nested, Location, Value s, ValueRange carried) {
        OpBuilder::InsertionGuard guard(b);
        b.setInsertionPoint(nested.getInsertionBlock(),
                            nested.getInsertionPoint());
        SmallVector<Value> v(carried.begin() + rowAt,
                             carried.begin() + rowAt + C);
        SmallVector<Value> prefetched = loadSourceRow(
            e, k.arg(sources), e.addI(s, e.constI64(1)), L, rowc, spec.value);
        SmallVector<Value> partials;
        Value squares = e.constF32(0.0);
        for (int64_t c = 0; c < C; ++c)
          squares = e.add(squares,
                          e.sumVector(e.select(keyMasks[c], e.mul(v[c], v[c]),
                                               e.zeroVector())));
        partials.push_back(squares);
        for (int64_t m = 0; m < M; ++m)
          partials.push_back(dotChunks(e, v, a[m]));
        SmallVector<Value> sums = e.rowSum(partials);
        Value rho = normFactor(e, sums[0], R, spec.eps);
        SmallVector<Value> next;
        SmallVector<Value> maxes, weightSums, accs;
        for (int64_t m = 0; m < M; ++m) {
          Value z = e.mul(e.constF32(spec.scale), e.mul(rho, sums[1 + m]));
          Value previous = carried[maxAt + m];
          Value newMax = e.maximum(previous, z);
          Value alpha = e.exp(e.sub(previous, newMax));
          Value beta = e.exp(e.sub(z, newMax));
          maxes.push_back(newMax);
          weightSums.push_back(e.add(e.mul(carried[sumAt + m], alpha), beta));
          Value alphaV = e.splat(alpha, layout.vectorWidth);
          Value betaV = e.splat(beta, layout.vectorWidth);
          for (int64_t c = 0; c < C; ++c)
            accs.push_back(e.add(e.mul(carried[accAt + m * C + c], alphaV),
                                 e.mul(v[c], betaV)));
        }
        llvm::append_range(next, maxes);
        llvm::append_range(next, weightSums);
        llvm::append_range(next, accs);
        llvm::append_range(next, prefetched);
        scf::YieldOp::create(b, loc, next);
      });
  ValueRange results = loop.getResults();

  Value isLane0 = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                        e.lane, e.constI64(0));
  Value writesLse = arith::AndIOp::create(b, loc, valid, isLane0);
  SmallVector<SmallVector<Value>> weights;
  if (norm)
    weights = loadWeightRows(e, k.arg(outputNorm), spec.outputNorm,
                             spec.perQueryOutputNorm ? M : 1);
  for (int64_t m = 0; m < M; ++m) {
    Value weightSum = results[sumAt + m];
    Value lse = e.add(results[maxAt + m], e.log(weightSum));
    SmallVector<Value> oPreRow =
        scaleChunks(e,
                    SmallVector<Value>(results.begin() + accAt + m * C,
                                       results.begin() + accAt + (m + 1) * C),
                    e.div(e.constF32(1.0), weightSum));
    // Output row index: (p * M + m) * N + row for partials, m * N + row.
    Value outRowBase = e.constI64(m);
    if (partial)
      outRowBase = e.addI(e.mulI(e.blockY, e.constI64(M)), outRowBase);
    Value outRow = e.addI(e.mulI(outRowBase, N), row);
    if (partial) {
      storeRow(e, oPreRow, k.arg(out), outRow, f32, valid);
    } else {
      SmallVector<Value> oRow = oPreRow;
      if (norm) {
        Value squares = dotChunks(e, oPreRow, oPreRow);
        Value rho = normFactor(e, e.rowSum({squares})[0], D, spec.eps);
        ArrayRef<Value> weight = weights[spec.perQueryOutputNorm ? m : 0];
        oRow.clear();
        Value rhoV = e.splat(rho, layout.vectorWidth);
        for (int64_t c = 0; c < C; ++c)
          oRow.push_back(e.mul(e.mul(oPreRow[c], rhoV), weight[c]));
      }
      storeRow(e, oRow, k.arg(out), outRow, spec.output, valid);
      if (oPre)
        storeRow(e, oPreRow, k.arg(oPreOut), outRow, spec.output, valid);
    }
    e.ifThen(writesLse,
             [&] { e.storeScalar(lse, k.arg(lseOut), outRow, f32); });
  }
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = {"N", 1, layout.rowsPerBlock};
  info.grid[1] = partial ? GridDimension{"P", 1, 1} : GridDimension{"1", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}

//===----------------------------------------------------------------------===//
// merge
//===----------------------------------------------------------------------===//

KernelInfo mlir::attnres::gpu_kernels::emitMergeKernel(OpBuilder &b,
                                                       Location loc,
                                                       StringRef name,
                                                       const MergeSpec &spec,
                                                       RowLayout layout) {
  KernelBuilder k(b, loc, name, "merge");
  Type f32 = b.getF32Type();
  int64_t D = spec.width, C = layout.chunks;
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
  unsigned rowsArg = k.scalar("num_rows");
  unsigned partitionsArg = k.scalar("num_partitions");
  int rowsPerWeight = spec.perRowGroupWeight ? k.scalar("rows_per_weight") : -1;

  bool unrolled =
      spec.staticPartitions > 0 && spec.staticPartitions <= kRegisterPartitions;
  int64_t weightTile =
      std::clamp<int64_t>(kWeightFloats / layout.rowsPerBlock, 1, 128);
  KernelEmitter e(b, loc, layout);
  int64_t reduceFloats = e.workgroupFloats(1);
  k.begin(layout.blockThreads(),
          reduceFloats + (unrolled ? 0 : layout.rowsPerBlock * weightTile));
  e.setUpThreads(k.workgroup());
  Value rows = k.arg(rowsArg), P = k.arg(partitionsArg);
  Value row =
      e.addI(e.mulI(e.blockX, e.constI64(layout.rowsPerBlock)), e.group);
  Value valid = e.lessThan(row, rows);
  Value rowc = e.minI(row, e.addI(rows, e.constI64(-1)));
  Value negInf = e.constF32(-kInf);
  Value zero = e.zeroVector();
  Value sinkLogit = sink >= 0 ? e.loadScalar(k.arg(sink), rowc, f32) : negInf;
  auto lseOf = [&](Value p) {
    return e.loadScalar(k.arg(partialLse), e.addI(e.mulI(p, rows), rowc), f32);
  };
  // w(x) = 0 for an empty partition, 1 at the maximum (so that a +inf
  // maximum gives 1, not inf - inf), exp(x - max) otherwise.
  Value maximum;
  auto weightOf = [&](Value x) {
    Value w = e.select(e.equal(x, maximum), e.constF32(1.0),
                       e.exp(e.sub(x, maximum)));
    return e.select(e.equal(x, negInf), e.constF32(0.0), w);
  };
  // An empty partition's row may hold anything, NaN included: it is selected
  // away, never multiplied in.
  auto accumulate = [&](ArrayRef<Value> acc, Value w, Value p) {
    Value contributes =
        e.splat(e.greater(w, e.constF32(0.0)), layout.vectorWidth);
    Value wV = e.splat(w, layout.vectorWidth);
    SmallVector<Value> part =
        loadRow(e, k.arg(partials), e.addI(e.mulI(p, rows), rowc), f32);
    SmallVector<Value> next;
    for (int64_t c = 0; c < C; ++c)
      next.push_back(
          e.add(acc[c], e.select(contributes, e.mul(part[c], wV), zero)));
    return next;
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
        b, loc, e.constI64(0), e.ceilDivI(P, tile), e.constI64(1), init.values,
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
          auto inner = scf::ForOp::create(
              b, loc, tileStart, tileEnd, e.constI64(1), carried,
              [&](OpBuilder &innerBuilder, Location, Value p,
                  ValueRange partial) {
                OpBuilder::InsertionGuard innerGuard(b);
                b.setInsertionPoint(innerBuilder.getInsertionBlock(),
                                    innerBuilder.getInsertionPoint());
                Value w = memref::LoadOp::create(
                    b, loc, weights, ValueRange{slot(p, tileStart)});
                scf::YieldOp::create(
                    b, loc, accumulate(SmallVector<Value>(partial), w, p));
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
    Value rho =
        normFactor(e, e.rowSum({dotChunks(e, merged, merged)})[0], D, spec.eps);
    Value rhoV = e.splat(rho, layout.vectorWidth);
    oRow.clear();
    for (int64_t c = 0; c < C; ++c)
      oRow.push_back(e.mul(e.mul(merged[c], rhoV), h[c]));
  }
  storeRow(e, oRow, k.arg(out), row, spec.output, valid);
  if (oPreOut >= 0)
    storeRow(e, merged, k.arg(oPreOut), row, spec.output, valid);
  Value isLane0 = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                        e.lane, e.constI64(0));
  e.ifThen(arith::AndIOp::create(b, loc, valid, isLane0),
           [&] { e.storeScalar(lse, k.arg(lseOut), row, f32); });
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = {"rows", 1, layout.rowsPerBlock};
  info.grid[1] = {"1", 1, 1};
  info.grid[2] = {"1", 1, 1};
  return info;
}

//===----------------------------------------------------------------------===//
// backward
//===----------------------------------------------------------------------===//

KernelInfo mlir::attnres::gpu_kernels::emitBackwardKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    RowLayout layout) {
  KernelBuilder k(b, loc, name, "backward");
  int64_t L = spec.numSources, D = spec.width, R = spec.rank,
          M = spec.numQueries, C = layout.chunks;
  int64_t weightRows = spec.perQueryOutputNorm ? M : 1;
  Type f32 = b.getF32Type();
  unsigned sources = k.table("sources", spec.value, "L x [N, D]");
  unsigned query = k.buffer("query", spec.query, "[M, R]");
  int keyNorm = spec.keyNorm ? k.buffer("key_norm", spec.keyNorm, "[R]") : -1;
  int outputNorm = spec.outputNorm
                       ? k.buffer("output_norm", spec.outputNorm,
                                  spec.perQueryOutputNorm ? "[M, D]" : "[D]")
                       : -1;
  unsigned grad = k.buffer("grad", spec.grad, "[M, N, D]");
  unsigned lseIn = k.buffer("lse", f32, "[M, N]");
  int saved = spec.saved ? k.buffer("saved", spec.saved, "[M, N, D]") : -1;
  unsigned gradSources = k.table("grad_sources", spec.value, "L x [N, D]");
  unsigned partialDa =
      k.buffer("partial_da", f32, "[B * rows_per_block, M, R]");
  int partialDh = spec.outputNorm ? k.buffer("partial_dh", f32,
                                             spec.perQueryOutputNorm
                                                 ? "[B * rows_per_block, M, D]"
                                                 : "[B * rows_per_block, 1, D]")
                                  : -1;
  unsigned tokens = k.scalar("num_tokens");
  unsigned blocks = k.scalar("num_blocks");

  KernelEmitter e(b, loc, layout);
  k.begin(layout.blockThreads(), e.workgroupFloats(1 + 2 * M));
  e.setUpThreads(k.workgroup());
  Value N = k.arg(tokens), B = k.arg(blocks);
  SmallVector<Value> keyMasks = e.keyMasks(R);
  auto a = keyQuery(e, spec, k.arg(query),
                    keyNorm >= 0 ? k.arg(keyNorm) : Value(), keyMasks);
  SmallVector<SmallVector<Value>> weights;
  if (outputNorm >= 0)
    weights = loadWeightRows(e, k.arg(outputNorm), spec.outputNorm, weightRows);

  // The tokens of this block and the trips every row group makes over them.
  Value G = e.constI64(layout.rowsPerBlock);
  Value chunk = e.ceilDivI(N, B);
  Value start = e.minI(e.mulI(e.blockX, chunk), N);
  Value stop = e.minI(e.addI(start, chunk), N);
  Value trips = e.ceilDivI(chunk, G);
  Value lastRow = e.addI(N, e.constI64(-1));
  int64_t width = layout.vectorWidth;
  Value zero = e.zeroVector();

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
        Value validV = e.splat(valid, width);

        SmallVector<Value> lse;
        SmallVector<SmallVector<Value>> dOut, oPre;
        for (int64_t m = 0; m < M; ++m) {
          Value perQueryRow = e.addI(e.mulI(e.constI64(m), N), rowc);
          lse.push_back(e.loadScalar(k.arg(lseIn), perQueryRow, f32));
          dOut.push_back(loadRow(e, k.arg(grad), perQueryRow, spec.grad));
          if (saved >= 0)
            oPre.push_back(loadRow(e, k.arg(saved), perQueryRow, spec.saved));
        }
        if (saved < 0) {
          // Recompute o_pre = sum_s p_s v_s with p_s = exp(z_s - lse).
          Carried accInit;
          accInit.add(SmallVector<Value>(M * C, zero));
          auto recompute = scf::ForOp::create(
              b, loc, e.constI64(0), e.constI64(L), e.constI64(1),
              accInit.values,
              [&](OpBuilder &inner, Location, Value s, ValueRange acc) {
                OpBuilder::InsertionGuard innerGuard(b);
                b.setInsertionPoint(inner.getInsertionBlock(),
                                    inner.getInsertionPoint());
                Value source = e.loadPointer(k.arg(sources), s);
                SmallVector<Value> v = loadRow(e, source, rowc, spec.value);
                SmallVector<Value> partials;
                Value squares = e.constF32(0.0);
                for (int64_t c = 0; c < C; ++c)
                  squares = e.add(
                      squares, e.sumVector(e.select(keyMasks[c],
                                                    e.mul(v[c], v[c]), zero)));
                partials.push_back(squares);
                for (int64_t m = 0; m < M; ++m)
                  partials.push_back(dotChunks(e, v, a[m]));
                SmallVector<Value> sums = e.rowSum(partials);
                Value rho = normFactor(e, sums[0], R, spec.eps);
                SmallVector<Value> next;
                for (int64_t m = 0; m < M; ++m) {
                  Value z =
                      e.mul(e.constF32(spec.scale), e.mul(rho, sums[1 + m]));
                  Value pV = e.splat(e.exp(e.sub(z, lse[m])), width);
                  for (int64_t c = 0; c < C; ++c)
                    next.push_back(e.add(acc[m * C + c], e.mul(v[c], pV)));
                }
                scf::YieldOp::create(b, loc, next);
              });
          for (int64_t m = 0; m < M; ++m)
            oPre.push_back(SmallVector<Value>(
                recompute.getResults().begin() + m * C,
                recompute.getResults().begin() + (m + 1) * C));
        }

        // do_pre, through the output norm when there is one.
        SmallVector<SmallVector<Value>> dPre = dOut;
        SmallVector<Value> dh(carried.begin() + dhAt,
                              carried.begin() + dhAt +
                                  (outputNorm >= 0 ? weightRows * C : 0));
        if (outputNorm >= 0) {
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
            Value term = e.constF32(0.0);
            for (int64_t c = 0; c < C; ++c)
              term = e.add(term, e.sumVector(e.mul(e.mul(xhat[m][c], h[c]),
                                                   dOut[m][c])));
            meanTerms.push_back(term);
          }
          SmallVector<Value> meanSums = e.rowSum(meanTerms);
          for (int64_t m = 0; m < M; ++m) {
            ArrayRef<Value> h = weights[spec.perQueryOutputNorm ? m : 0];
            Value meanV = e.splat(
                e.div(meanSums[m], e.constF32(static_cast<double>(D))), width);
            Value rhoV = e.splat(rhos[m], width);
            int64_t weightRow = spec.perQueryOutputNorm ? m : 0;
            for (int64_t c = 0; c < C; ++c) {
              dPre[m][c] = e.mul(rhoV, e.sub(e.mul(h[c], dOut[m][c]),
                                             e.mul(xhat[m][c], meanV)));
              Value contribution = e.mul(xhat[m][c], dOut[m][c]);
              dh[weightRow * C + c] = e.add(
                  dh[weightRow * C + c], e.select(validV, contribution, zero));
            }
          }
        }
        SmallVector<Value> deltaTerms;
        for (int64_t m = 0; m < M; ++m)
          deltaTerms.push_back(dotChunks(e, dPre[m], oPre[m]));
        SmallVector<Value> delta = e.rowSum(deltaTerms);

        // One pass over the sources: dv, and the block's share of da.
        SmallVector<Value> loopInit(carried.take_front(M * C));
        llvm::append_range(loopInit,
                           loadSourceRow(e, k.arg(sources), e.constI64(0), L,
                                         rowc, spec.value));
        auto sourcesLoop = scf::ForOp::create(
            b, loc, e.constI64(0), e.constI64(L), e.constI64(1), loopInit,
            [&](OpBuilder &inner, Location, Value s, ValueRange loopCarried) {
              OpBuilder::InsertionGuard innerGuard(b);
              b.setInsertionPoint(inner.getInsertionBlock(),
                                  inner.getInsertionPoint());
              ValueRange da = loopCarried.take_front(M * C);
              SmallVector<Value> v(loopCarried.drop_front(M * C));
              SmallVector<Value> prefetched =
                  loadSourceRow(e, k.arg(sources), e.addI(s, e.constI64(1)), L,
                                rowc, spec.value);
              SmallVector<Value> partials;
              Value squares = e.constF32(0.0);
              for (int64_t c = 0; c < C; ++c)
                squares =
                    e.add(squares, e.sumVector(e.select(
                                       keyMasks[c], e.mul(v[c], v[c]), zero)));
              partials.push_back(squares);
              for (int64_t m = 0; m < M; ++m)
                partials.push_back(dotChunks(e, v, a[m]));
              for (int64_t m = 0; m < M; ++m)
                partials.push_back(dotChunks(e, v, dPre[m]));
              SmallVector<Value> sums = e.rowSum(partials);
              Value rho = normFactor(e, sums[0], R, spec.eps);
              SmallVector<Value> dv(C, zero), keyTerm(C, zero);
              SmallVector<Value> next;
              SmallVector<Value> dsRho;
              for (int64_t m = 0; m < M; ++m) {
                Value ell = e.mul(rho, sums[1 + m]);
                Value p =
                    e.exp(e.sub(e.mul(e.constF32(spec.scale), ell), lse[m]));
                Value ds = e.mul(e.constF32(spec.scale),
                                 e.mul(p, e.sub(sums[1 + M + m], delta[m])));
                Value pV = e.splat(p, width);
                Value dsRhoV = e.splat(e.mul(ds, rho), width);
                Value correction = e.splat(
                    e.div(e.mul(rho, ell), e.constF32(static_cast<double>(R))),
                    width);
                for (int64_t c = 0; c < C; ++c) {
                  dv[c] = e.add(dv[c], e.mul(pV, dPre[m][c]));
                  keyTerm[c] = e.add(
                      keyTerm[c],
                      e.mul(dsRhoV, e.sub(a[m][c], e.mul(correction, v[c]))));
                }
                dsRho.push_back(dsRhoV);
              }
              for (int64_t c = 0; c < C; ++c)
                dv[c] = e.add(dv[c], e.select(keyMasks[c], keyTerm[c], zero));
              Value target = e.loadPointer(k.arg(gradSources), s);
              storeRow(e, dv, target, rowc, spec.value, valid);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t c = 0; c < C; ++c) {
                  Value contributes =
                      arith::AndIOp::create(b, loc, keyMasks[c], validV);
                  next.push_back(e.add(
                      da[m * C + c],
                      e.select(contributes, e.mul(dsRho[m], v[c]), zero)));
                }
              llvm::append_range(next, prefetched);
              scf::YieldOp::create(b, loc, next);
            });
        SmallVector<Value> next(sourcesLoop.getResults().take_front(M * C));
        llvm::append_range(next, dh);
        scf::YieldOp::create(b, loc, next);
      });

  // The block's partial rows: this row group's share of da (key coordinates)
  // and of dh.
  Value partialRow =
      e.addI(e.mulI(e.blockX, e.constI64(layout.rowsPerBlock)), e.group);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < C; ++c) {
      Value da = rows.getResult(daAt + m * C + c);
      for (int64_t j = 0; j < width; ++j) {
        Value isKey = vector::ExtractOp::create(b, loc, keyMasks[c],
                                                ArrayRef<int64_t>{j});
        e.ifThen(isKey, [&] {
          Value d = vector::ExtractOp::create(b, loc, e.elementIndex[c],
                                              ArrayRef<int64_t>{j});
          Value r = arith::SubIOp::create(b, loc, d, e.constI64(D - R));
          Value index = e.addI(
              e.mulI(e.addI(e.mulI(partialRow, e.constI64(M)), e.constI64(m)),
                     e.constI64(R)),
              r);
          Value value =
              vector::ExtractOp::create(b, loc, da, ArrayRef<int64_t>{j});
          e.storeScalar(value, k.arg(partialDa), index, f32);
        });
      }
    }
  if (partialDh >= 0) {
    for (int64_t w = 0; w < weightRows; ++w) {
      SmallVector<Value> dh;
      for (int64_t c = 0; c < C; ++c)
        dh.push_back(rows.getResult(dhAt + w * C + c));
      Value outRow =
          e.addI(e.mulI(partialRow, e.constI64(weightRows)), e.constI64(w));
      Value always = arith::ConstantOp::create(b, loc, b.getBoolAttr(true));
      storeRow(e, dh, k.arg(partialDh), outRow, f32, always);
    }
  }
  KernelInfo info = k.finish();
  info.vectorWidth = layout.vectorWidth;
  info.grid[0] = {"B", 1, 1};
  info.grid[1] = {"1", 1, 1};
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

KernelInfo mlir::attnres::gpu_kernels::emitFinalizeKernel(
    OpBuilder &b, Location loc, StringRef name, const AttnResSpec &spec,
    int64_t threads) {
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

  RowLayout flat;
  KernelEmitter e(b, loc, flat);
  k.begin(threads, 1);
  Value K = k.arg(partialRows);
  Value index = globalThread(e, threads);
  int64_t dqCount = M * R, dgCount = keyNorm >= 0 ? R : 0;
  int64_t dhCount = dh >= 0 ? weightRows * D : 0;

  // da[m][r] summed over the partial rows, in order.
  auto daSum = [&](Value m, Value r) {
    return sumStrided(e, k.arg(partialDa), K, e.constI64(M * R),
                      e.addI(e.mulI(m, e.constI64(R)), r));
  };
  e.ifThen(e.lessThan(index, e.constI64(dqCount)), [&] {
    Value m = e.divI(index, e.constI64(R));
    Value r = arith::RemUIOp::create(b, loc, index, e.constI64(R));
    Value value = daSum(m, r);
    if (keyNorm >= 0)
      value = e.mul(value, e.loadScalar(k.arg(keyNorm), r, spec.keyNorm));
    e.storeScalar(value, k.arg(dq), index, spec.gradQuery);
  });
  if (dg >= 0) {
    e.ifThen(e.inRange(index, dqCount, dgCount), [&] {
      Value r = e.addI(index, e.constI64(-dqCount));
      Value value = e.constF32(0.0);
      for (int64_t m = 0; m < M; ++m) {
        Value q = e.loadScalar(k.arg(query), e.addI(e.constI64(m * R), r),
                               spec.query);
        value = e.add(value, e.mul(daSum(e.constI64(m), r), q));
      }
      e.storeScalar(value, k.arg(dg), r, spec.gradKeyNorm);
    });
  }
  if (dh >= 0) {
    int64_t first = dqCount + dgCount;
    e.ifThen(e.inRange(index, first, dhCount), [&] {
      Value j = e.addI(index, e.constI64(-first));
      Value value =
          sumStrided(e, k.arg(partialDh), K, e.constI64(weightRows * D), j);
      e.storeScalar(value, k.arg(dh), j, spec.gradOutputNorm);
    });
  }
  KernelInfo info = k.finish();
  info.grid[0] = {"1", dqCount + dgCount + dhCount, threads};
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
