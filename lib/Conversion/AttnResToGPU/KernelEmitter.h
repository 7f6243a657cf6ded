//===- KernelEmitter.h - building attnres GPU kernels -----------*- C++ -*-===//
//
// The attnres kernels stream rows of width D: one row per block when a row
// needs more threads than a subgroup, else several rows per block, each on a
// group of lanes of one subgroup (RowLayout; how many lanes a row gets is an
// option of convert-attnres-to-gpu). Every thread owns `chunks` vectors of
// `vectorWidth` elements of a row (16 bytes for bf16/f16 and f32 when D
// allows it), which it reads with one aligned vector load each; row sums go
// through subgroup butterflies (gpu.shuffle xor) and, across subgroups, a
// workgroup buffer (double-buffered for the sums of a loop, so that each
// needs one barrier). All arithmetic is FP32.
//
// Global memory is reached through `!llvm.ptr<1>` kernel arguments, so that
// loads and stores carry their alignment to the backends (ld.global.v4 on
// NVPTX, global_load_dwordx4 on AMDGPU).
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H
#define ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H

#include "attnres/Dialect/AttnRes/Utils/FloatArithmetic.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"

namespace mlir::attnres::gpu_kernels {

/// How the threads of a block cover rows of width D.
struct RowLayout {
  int64_t width = 0;         // D
  int64_t vectorWidth = 1;   // elements per vector access
  int64_t vectors = 0;       // D / vectorWidth
  int64_t threadsPerRow = 0; // lanes on one row
  int64_t rowsPerBlock = 1;  // rows a block works on at once
  int64_t chunks = 1;        // vectors per thread
  int64_t subgroupSize = 32; // 32 on NVIDIA, 64 on AMD
  int64_t blockThreads() const { return threadsPerRow * rowsPerBlock; }
  /// More lanes than a subgroup: row sums go through workgroup memory.
  bool blockReduce() const { return threadsPerRow > subgroupSize; }
  int64_t subgroupsPerRow() const {
    return blockReduce() ? threadsPerRow / subgroupSize : 1;
  }

  /// The widest power-of-two vector of at most 16 bytes of `elementBytes`
  /// elements that divides a row of `width`.
  static int64_t vectorWidthFor(int64_t width, int64_t elementBytes);

  /// `elementBytes` is the size of the narrowest element type streamed.
  /// `threadsPerRow` = 0 picks the lanes of a row automatically (see
  /// docs/Performance.md); otherwise it must be a power of two, or a multiple
  /// of the subgroup, no larger than `maxBlockThreads`.
  static FailureOr<RowLayout> choose(int64_t width, int64_t elementBytes,
                                     int64_t subgroupSize,
                                     int64_t maxBlockThreads,
                                     int64_t threadsPerRow = 0);
};

/// How a kernel walks over the L sources of a row.
struct SourceSchedule {
  /// Sources whose rows are loaded before one row sum reduces all of their
  /// dot products together: the loads in flight per thread, and one
  /// reduction (one barrier) per batch instead of one per source.
  int64_t batch = 1;
  /// Load the next batch's rows while the current batch is reduced.
  bool prefetch = true;
  /// Up to this many sources, the batch loop is unrolled at compile time.
  int64_t unrollLimit = 0;
  /// Batches whose rows are copied ahead into workgroup memory with
  /// asynchronous copies (NVIDIA cp.async, sm_80 and later), which hold no
  /// registers while in flight; 0: rows are loaded into registers (and
  /// `prefetch` applies).
  int64_t stagedBatches = 0;
  /// Float offset of the staging ring in the workgroup buffer (set by the
  /// kernel, after its row sums' region).
  int64_t stagingOffset = 0;
};

/// Emits the body of one gpu.func. Its FP32 arithmetic is the kernels'
/// (FloatArithmetic's Fused mode: products and sums may fuse, e^x and ln x
/// through exp2 / log2).
class KernelEmitter : public FloatArithmetic {
public:
  KernelEmitter(OpBuilder &builder, Location loc, RowLayout layout)
      : FloatArithmetic(builder, loc, Mode::Fused), layout(layout),
        f32(builder.getF32Type()), i64(builder.getI64Type()) {}

  RowLayout layout;
  Type f32, i64;

  // Constants.
  Value constI64(int64_t value);
  Value constIndex(int64_t value);
  Value splat(Value scalar, int64_t width);
  Value zeroVector() { return splat(constF32(0.0), layout.vectorWidth); }

  // i64 arithmetic (indices and sizes).
  Value addI(Value x, Value y);
  Value mulI(Value x, Value y);
  Value minI(Value x, Value y);
  Value divI(Value x, Value y); // unsigned floor division
  Value ceilDivI(Value x, Value y);
  Value lessThan(Value x, Value y); // signed
  /// first <= x < first + count (signed).
  Value inRange(Value x, int64_t first, int64_t count);
  Value toI64(Value index);

  // FP32 arithmetic beyond FloatArithmetic's.
  Value equal(Value x, Value y) {
    return compare(arith::CmpFPredicate::OEQ, x, y);
  }
  Value greater(Value x, Value y) {
    return compare(arith::CmpFPredicate::OGT, x, y);
  }
  Value sumVector(Value vector);

  // Global memory. Indices count elements of `elementType`.
  Value loadVector(Value base, Value index, Type elementType);
  /// The vector as stored (not extended to FP32): what a prefetch keeps in
  /// registers, at half the size for 16-bit types.
  Value loadVectorRaw(Value base, Value index, Type elementType);
  /// FP32 of a vector `loadVectorRaw` returned.
  Value extend(Value vector);
  void storeVector(Value vector, Value base, Value index, Type elementType);
  /// Stores a vector already in its storage type.
  void storeVectorRaw(Value vector, Value base, Value index);
  /// `count` bytes from byte `index` (vector<count x i8>, aligned to
  /// `count`), and the store of such a vector.
  Value loadBytes(Value base, Value index, int64_t count);
  void storeBytes(Value bytes, Value base, Value index);
  Value loadScalar(Value base, Value index, Type elementType);
  void storeScalar(Value value, Value base, Value index, Type elementType);
  /// Entry `index` of a device table of global pointers.
  Value loadPointer(Value table, Value index);
  /// Whether a global pointer is not null (i1).
  Value notNull(Value pointer);
  /// An entry of a table of gradient rows, split into the row's address and
  /// whether bit 0 of the entry is set (i1): rows are 16-byte aligned, so
  /// the bit is free to ask an accumulating backward to write that row over
  /// instead of adding to it.
  std::pair<Value, Value> splitWriteTag(Value entry);

  /// Runs `body` only where `condition` holds.
  void ifThen(Value condition, function_ref<void()> body);

  /// The rows of this block, rowsPerBlock at a time: `body(row, inTile)`
  /// runs for each step. A kernel's block has one step, rows blockIdx.x *
  /// rowsPerBlock on, and `inTile` is null. A launch body's block
  /// (setBlockRows) walks its rows [first, first + count) in an scf.for
  /// whose iterations end with a barrier (so that a step's workgroup data
  /// never overwrites what a thread still reads of the last), and `inTile`
  /// (i1) says whether the row lies among them.
  void forEachRowStep(function_ref<void(Value row, Value inTile)> body);
  /// Makes the block's rows [first, first + count) (i64, the same in every
  /// thread of the block), which forEachRowStep then walks: the rows a launch
  /// body of attnres-lower-tiles-to-gpu is given.
  void setBlockRows(Value first, Value count) {
    blockFirstRow = first;
    blockRowCount = count;
  }

  // Thread geometry, valid once `setUpThreads` has run.
  void setUpThreads(Value workgroupBuffer);
  Value workgroupBuffer() const { return workgroup; }
  /// The workgroup buffer from float `offset` on, as a pointer into the
  /// shared address space (what asynchronous copies write to).
  Value workgroupPointer(Value offset);
  Value thread; // i64, thread within the block
  Value lane;   // i64, lane within the row group
  Value group;  // i64, row group within the block
  Value blockX; // i64
  Value blockY; // i64
  /// Vector index of chunk c for this lane (clamped into the row) and
  /// whether the chunk lies in the row.
  SmallVector<Value> vectorIndex, chunkActive;
  /// Element offsets of chunk c (vector<vectorWidth x i64>).
  SmallVector<Value> elementIndex;

  /// Reserves the workgroup memory of the row sums (before the kernel is
  /// created): `settledValues` for sums that end with a barrier, and two
  /// halves of `loopValues` each for the sums of a loop, which alternate
  /// between them and need one barrier each.
  void planReductions(int64_t settledValues, int64_t loopValues);
  /// Floats of workgroup memory the planned row sums use; a kernel's own
  /// workgroup data starts there.
  int64_t reductionFloats() const;

  /// Sums each of `values` over the lanes of a row; every lane gets the
  /// totals, bit-identical across lanes, added in a fixed order. Without
  /// `half` the sums go through the settled region and end with a barrier;
  /// with `half` (i64, 0 or 1) through that loop half, with one barrier:
  /// consecutive calls must alternate halves.
  SmallVector<Value> rowSum(ArrayRef<Value> values, Value half = {});
  /// The same with maximum.
  SmallVector<Value> rowMax(ArrayRef<Value> values);

  /// Elements of the chunk vectors that are key coordinates (d >= D - R) and
  /// lie in the row: vector<vectorWidth x i1> per chunk.
  SmallVector<Value> keyMasks(int64_t rank);

private:
  SmallVector<Value> rowReduce(ArrayRef<Value> values, bool maximum,
                               Value half);
  /// Floats between the partial sums of two values: the subgroups of a row,
  /// padded to the width the totals are read with.
  int64_t valueStride() const;
  int64_t readWidth() const;
  int64_t settledValues = 0, loopValues = 0;
  Value blockFirstRow, blockRowCount;
  Value workgroup;
  Value laneInSubgroup, subgroupInRow;
};

} // namespace mlir::attnres::gpu_kernels

#endif // ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H
