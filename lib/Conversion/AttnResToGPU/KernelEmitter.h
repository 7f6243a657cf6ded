//===- KernelEmitter.h - building attnres GPU kernels -----------*- C++ -*-===//
//
// The attnres kernels stream rows of width D: one row per block when a row
// needs more threads than a subgroup, else several rows per block, each on a
// group of lanes of one subgroup. Every thread owns `chunks` vectors of
// `vectorWidth` elements of a row (16 bytes for bf16/f16 and f32 when D
// allows it), which it reads with one aligned vector load each; row sums go
// through subgroup butterflies (gpu.shuffle xor) and, across subgroups, a
// workgroup buffer. All arithmetic is FP32.
//
// Global memory is reached through `!llvm.ptr<1>` kernel arguments, so that
// loads and stores carry their alignment to the backends (ld.global.v4 on
// NVPTX, global_load_dwordx4 on AMDGPU).
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H
#define ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H

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

  /// `elementBytes` is the size of the narrowest element type streamed.
  static RowLayout choose(int64_t width, int64_t elementBytes,
                          int64_t subgroupSize, int64_t maxBlockThreads);
};

/// Emits the body of one gpu.func.
class KernelEmitter {
public:
  KernelEmitter(OpBuilder &builder, Location loc, RowLayout layout)
      : b(builder), loc(loc), layout(layout), f32(builder.getF32Type()),
        i64(builder.getI64Type()) {}

  OpBuilder &b;
  Location loc;
  RowLayout layout;
  Type f32, i64;

  // Constants.
  Value constF32(double value);
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

  // FP32 arithmetic on scalars or vectors.
  Value add(Value x, Value y);
  Value sub(Value x, Value y);
  Value mul(Value x, Value y);
  Value div(Value x, Value y);
  Value maximum(Value x, Value y);
  Value select(Value condition, Value x, Value y);
  Value equal(Value x, Value y);
  Value greater(Value x, Value y);
  /// e^x through exp2, which both backends have natively.
  Value exp(Value x);
  /// ln x through log2.
  Value log(Value x);
  Value rsqrt(Value x);
  Value sumVector(Value vector);

  // Global memory. Indices count elements of `elementType`.
  Value loadVector(Value base, Value index, Type elementType);
  void storeVector(Value vector, Value base, Value index, Type elementType);
  Value loadScalar(Value base, Value index, Type elementType);
  void storeScalar(Value value, Value base, Value index, Type elementType);
  /// Entry `index` of a device table of global pointers.
  Value loadPointer(Value table, Value index);

  /// Runs `body` only where `condition` holds.
  void ifThen(Value condition, function_ref<void()> body);

  // Thread geometry, valid once `setUpThreads` has run.
  void setUpThreads(Value workgroupBuffer);
  Value workgroupBuffer() const { return workgroup; }
  Value lane;   // i64, lane within the row group
  Value group;  // i64, row group within the block
  Value blockX; // i64
  Value blockY; // i64
  /// Vector index of chunk c for this lane (clamped into the row) and
  /// whether the chunk lies in the row.
  SmallVector<Value> vectorIndex, chunkActive;
  /// Element offsets of chunk c (vector<vectorWidth x i64>).
  SmallVector<Value> elementIndex;

  /// Sums each of `values` over the lanes of a row; every lane gets the
  /// totals, bit-identical across lanes.
  SmallVector<Value> rowSum(ArrayRef<Value> values);
  /// The same with maximum.
  SmallVector<Value> rowMax(ArrayRef<Value> values);

  /// Elements of the chunk vectors that are key coordinates (d >= D - R) and
  /// lie in the row: vector<vectorWidth x i1> per chunk.
  SmallVector<Value> keyMasks(int64_t rank);

  /// Size in f32 of the workgroup buffer rowSum needs for `values` sums.
  int64_t workgroupFloats(int64_t values) const {
    return layout.blockReduce() ? layout.subgroupsPerRow() * values : 1;
  }

private:
  SmallVector<Value> rowReduce(ArrayRef<Value> values, bool maximum);
  Value workgroup;
  Value laneInSubgroup, subgroupInRow;
};

} // namespace mlir::attnres::gpu_kernels

#endif // ATTNRES_LIB_CONVERSION_ATTNRESTOGPU_KERNELEMITTER_H
