//===- KernelEmitter.cpp - building attnres GPU kernels -------------------===//

#include "KernelEmitter.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>

using namespace mlir;
using namespace mlir::attnres::gpu_kernels;

int64_t RowLayout::vectorWidthFor(int64_t width, int64_t elementBytes) {
  int64_t vectorWidth = std::max<int64_t>(1, 16 / elementBytes);
  while (width % vectorWidth != 0)
    vectorWidth /= 2;
  return vectorWidth;
}

FailureOr<RowLayout> RowLayout::choose(int64_t width, int64_t elementBytes,
                                       int64_t subgroupSize,
                                       int64_t maxBlockThreads,
                                       int64_t threadsPerRow) {
  RowLayout layout;
  layout.width = width;
  layout.subgroupSize = subgroupSize;
  layout.vectorWidth = vectorWidthFor(width, elementBytes);
  layout.vectors = width / layout.vectorWidth;
  if (threadsPerRow == 0) {
    if (layout.vectors <= subgroupSize) {
      threadsPerRow = llvm::PowerOf2Ceil(layout.vectors);
    } else {
      // Two vectors a thread: enough lanes that a row's loads are spread
      // wide, few enough that the accumulators of a thread stay small and
      // a block holds one row (docs/Performance.md has the measurements).
      threadsPerRow = std::min<int64_t>(
          llvm::alignTo(llvm::divideCeil(layout.vectors, 2), subgroupSize),
          maxBlockThreads);
    }
  }
  bool valid =
      threadsPerRow >= 1 && threadsPerRow <= maxBlockThreads &&
      (threadsPerRow <= subgroupSize ? llvm::isPowerOf2_64(threadsPerRow)
                                     : threadsPerRow % subgroupSize == 0);
  if (!valid)
    return failure();
  layout.threadsPerRow = threadsPerRow;
  layout.chunks = llvm::divideCeil(layout.vectors, threadsPerRow);
  // Rows on part of a subgroup share a block of four subgroups.
  layout.rowsPerBlock =
      threadsPerRow < subgroupSize ? 4 * subgroupSize / threadsPerRow : 1;
  if (threadsPerRow == subgroupSize)
    layout.rowsPerBlock = 4;
  return layout;
}

Value KernelEmitter::constI64(int64_t value) {
  return arith::ConstantOp::create(b, loc, i64, b.getI64IntegerAttr(value));
}
Value KernelEmitter::constIndex(int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}
Value KernelEmitter::splat(Value scalar, int64_t width) {
  return vector::BroadcastOp::create(
      b, loc, VectorType::get({width}, scalar.getType()), scalar);
}

Value KernelEmitter::addI(Value x, Value y) {
  return arith::AddIOp::create(b, loc, x, y);
}
Value KernelEmitter::mulI(Value x, Value y) {
  return arith::MulIOp::create(b, loc, x, y);
}
Value KernelEmitter::minI(Value x, Value y) {
  return arith::MinSIOp::create(b, loc, x, y);
}
Value KernelEmitter::divI(Value x, Value y) {
  return arith::DivUIOp::create(b, loc, x, y);
}
Value KernelEmitter::ceilDivI(Value x, Value y) {
  return arith::CeilDivUIOp::create(b, loc, x, y);
}
Value KernelEmitter::lessThan(Value x, Value y) {
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, x, y);
}
Value KernelEmitter::inRange(Value x, int64_t first, int64_t count) {
  Value atLeastFirst = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge,
                                             x, constI64(first));
  return arith::AndIOp::create(b, loc, atLeastFirst,
                               lessThan(x, constI64(first + count)));
}
Value KernelEmitter::toI64(Value index) {
  return arith::IndexCastOp::create(b, loc, i64, index);
}

Value KernelEmitter::sumVector(Value vector) {
  return vector::ReductionOp::create(b, loc, vector::CombiningKind::ADD,
                                     vector);
}

static Type globalPointer(MLIRContext *context) {
  return LLVM::LLVMPointerType::get(context, /*addressSpace=*/1);
}

static int64_t bytesOf(Type type) {
  return std::max<int64_t>(1, type.getIntOrFloatBitWidth() / 8);
}

Value KernelEmitter::loadVectorRaw(Value base, Value index, Type elementType) {
  int64_t width = layout.vectorWidth;
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                                      elementType, base, ValueRange{index});
  auto type = VectorType::get({width}, elementType);
  return LLVM::LoadOp::create(b, loc, type, address,
                              width * bytesOf(elementType));
}

Value KernelEmitter::extend(Value vector) {
  auto type = cast<VectorType>(vector.getType());
  if (type.getElementType() == f32)
    return vector;
  return LLVM::FPExtOp::create(b, loc, type.clone(f32), vector);
}

Value KernelEmitter::loadVector(Value base, Value index, Type elementType) {
  return extend(loadVectorRaw(base, index, elementType));
}

void KernelEmitter::storeVector(Value vector, Value base, Value index,
                                Type elementType) {
  int64_t width = layout.vectorWidth;
  if (elementType != f32)
    vector = LLVM::FPTruncOp::create(
        b, loc, VectorType::get({width}, elementType), vector);
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                                      elementType, base, ValueRange{index});
  LLVM::StoreOp::create(b, loc, vector, address, width * bytesOf(elementType));
}

void KernelEmitter::storeVectorRaw(Value vector, Value base, Value index) {
  auto type = cast<VectorType>(vector.getType());
  Value address =
      LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                          type.getElementType(), base, ValueRange{index});
  LLVM::StoreOp::create(b, loc, vector, address,
                        type.getNumElements() * bytesOf(type.getElementType()));
}

Value KernelEmitter::loadBytes(Value base, Value index, int64_t count) {
  Type i8 = b.getI8Type();
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()), i8,
                                      base, ValueRange{index});
  return LLVM::LoadOp::create(b, loc, VectorType::get({count}, i8), address,
                              count);
}

void KernelEmitter::storeBytes(Value bytes, Value base, Value index) {
  int64_t count = cast<VectorType>(bytes.getType()).getNumElements();
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                                      b.getI8Type(), base, ValueRange{index});
  LLVM::StoreOp::create(b, loc, bytes, address, count);
}

Value KernelEmitter::loadScalar(Value base, Value index, Type elementType) {
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                                      elementType, base, ValueRange{index});
  Value value =
      LLVM::LoadOp::create(b, loc, elementType, address, bytesOf(elementType));
  if (elementType != f32)
    value = LLVM::FPExtOp::create(b, loc, f32, value);
  return value;
}

void KernelEmitter::storeScalar(Value value, Value base, Value index,
                                Type elementType) {
  if (elementType != f32)
    value = LLVM::FPTruncOp::create(b, loc, elementType, value);
  Value address = LLVM::GEPOp::create(b, loc, globalPointer(b.getContext()),
                                      elementType, base, ValueRange{index});
  LLVM::StoreOp::create(b, loc, value, address, bytesOf(elementType));
}

Value KernelEmitter::loadPointer(Value table, Value index) {
  Type pointer = globalPointer(b.getContext());
  Value address =
      LLVM::GEPOp::create(b, loc, pointer, pointer, table, ValueRange{index});
  return LLVM::LoadOp::create(b, loc, pointer, address, /*alignment=*/8);
}

Value KernelEmitter::notNull(Value pointer) {
  Value null = LLVM::ZeroOp::create(b, loc, pointer.getType());
  return LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne, pointer, null);
}

std::pair<Value, Value> KernelEmitter::splitWriteTag(Value entry) {
  Value bits = LLVM::PtrToIntOp::create(b, loc, i64, entry);
  Value tag = arith::AndIOp::create(b, loc, bits, constI64(1));
  Value zero = constI64(0);
  // A byte offset back by the tag keeps the pointer a pointer (no integer
  // round trip that would hide its address space's provenance).
  Value back = arith::SubIOp::create(b, loc, zero, tag);
  Value row = LLVM::GEPOp::create(b, loc, entry.getType(), b.getI8Type(), entry,
                                  ValueRange{back});
  Value tagged =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, tag, zero);
  return {row, tagged};
}

void KernelEmitter::ifThen(Value condition, function_ref<void()> body) {
  auto ifOp = scf::IfOp::create(b, loc, condition, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifOp.thenBlock());
  body();
}

void KernelEmitter::forEachRowStep(
    function_ref<void(Value row, Value inTile)> body) {
  Value groupRows = constI64(layout.rowsPerBlock);
  if (!blockRowCount) {
    body(addI(mulI(blockX, groupRows), group), Value());
    return;
  }
  Value first = blockFirstRow, count = blockRowCount;
  Value steps = ceilDivI(count, groupRows);
  // Operands built one statement at a time: the order of a call's
  // arguments is the compiler's, and the IR must not depend on it.
  Value zero = constI64(0);
  Value one = constI64(1);
  auto loop = scf::ForOp::create(b, loc, zero, steps, one, ValueRange{});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(loop.getBody()->getTerminator());
  Value offset = addI(mulI(loop.getInductionVar(), groupRows), group);
  Value inTile = lessThan(offset, count);
  Value row = addI(first, offset);
  body(row, inTile);
  gpu::BarrierOp::create(b, loc);
}

void KernelEmitter::setUpThreads(Value workgroupBuffer) {
  workgroup = workgroupBuffer;
  Value tid = toI64(gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x));
  thread = tid;
  blockX = toI64(gpu::BlockIdOp::create(b, loc, gpu::Dimension::x));
  blockY = toI64(gpu::BlockIdOp::create(b, loc, gpu::Dimension::y));
  Value threadsPerRow = constI64(layout.threadsPerRow);
  lane = arith::RemUIOp::create(b, loc, tid, threadsPerRow);
  group = divI(tid, threadsPerRow);
  Value subgroup = constI64(layout.subgroupSize);
  laneInSubgroup = arith::RemUIOp::create(b, loc, tid, subgroup);
  subgroupInRow = divI(lane, subgroup);

  int64_t width = layout.vectorWidth;
  SmallVector<int64_t> offsets;
  for (int64_t j = 0; j < width; ++j)
    offsets.push_back(j);
  auto offsetType = VectorType::get({width}, i64);
  Value laneOffsets = arith::ConstantOp::create(
      b, loc, offsetType,
      DenseElementsAttr::get(offsetType, ArrayRef<int64_t>(offsets)));
  vectorIndex.clear();
  chunkActive.clear();
  elementIndex.clear();
  for (int64_t c = 0; c < layout.chunks; ++c) {
    Value index = addI(lane, constI64(c * layout.threadsPerRow));
    bool alwaysInRow = layout.vectors == layout.threadsPerRow * layout.chunks;
    Value active =
        alwaysInRow
            ? arith::ConstantOp::create(b, loc, b.getBoolAttr(true)).getResult()
            : lessThan(index, constI64(layout.vectors));
    Value clamped = minI(index, constI64(layout.vectors - 1));
    vectorIndex.push_back(clamped);
    chunkActive.push_back(active);
    elementIndex.push_back(
        addI(splat(mulI(clamped, constI64(width)), width), laneOffsets));
  }
}

Value KernelEmitter::workgroupPointer(Value offset) {
  Value base =
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, workgroup);
  Value address = LLVM::IntToPtrOp::create(
      b, loc, LLVM::LLVMPointerType::get(b.getContext(), 3), toI64(base));
  return LLVM::GEPOp::create(b, loc,
                             LLVM::LLVMPointerType::get(b.getContext(), 3), f32,
                             address, ValueRange{offset});
}

void KernelEmitter::planReductions(int64_t settled, int64_t loop) {
  settledValues = settled;
  loopValues = loop;
}

int64_t KernelEmitter::readWidth() const {
  int64_t subgroups = layout.subgroupsPerRow();
  return subgroups % 4 == 0 ? 4 : subgroups % 2 == 0 ? 2 : 1;
}

int64_t KernelEmitter::valueStride() const {
  return llvm::alignTo(layout.subgroupsPerRow(), readWidth());
}

int64_t KernelEmitter::reductionFloats() const {
  if (!layout.blockReduce())
    return 0;
  return valueStride() * (settledValues + 2 * loopValues);
}

SmallVector<Value> KernelEmitter::rowSum(ArrayRef<Value> values, Value half) {
  return rowReduce(values, /*maximum=*/false, half);
}

SmallVector<Value> KernelEmitter::rowMax(ArrayRef<Value> values) {
  return rowReduce(values, /*maximum=*/true, Value());
}

SmallVector<Value> KernelEmitter::rowReduce(ArrayRef<Value> values,
                                            bool maximum, Value half) {
  auto combine = [&](Value x, Value y) {
    return maximum ? this->maximum(x, y) : add(x, y);
  };
  SmallVector<Value> sums(values);
  int64_t span = std::min(layout.threadsPerRow, layout.subgroupSize);
  for (int64_t offset = span / 2; offset >= 1; offset /= 2)
    for (Value &sum : sums) {
      auto shuffle = gpu::ShuffleOp::create(
          b, loc, sum, static_cast<int32_t>(offset),
          static_cast<int32_t>(layout.subgroupSize), gpu::ShuffleMode::XOR);
      sum = combine(sum, shuffle.getShuffleResult());
    }
  if (!layout.blockReduce())
    return sums;

  // Across the subgroups of a row: the first lane of each subgroup writes
  // its sums ([value][subgroup], so that a lane reads the partial sums of a
  // value with few vector loads), then every lane adds them up in subgroup
  // order.
  int64_t count = sums.size();
  int64_t stride = valueStride(), subgroups = layout.subgroupsPerRow();
  Value region;
  if (half) {
    assert(count <= loopValues && "row sum larger than planned");
    region = addI(constI64(stride * settledValues),
                  mulI(half, constI64(stride * loopValues)));
  } else {
    assert(count <= settledValues && "row sum larger than planned");
    region = constI64(0);
  }
  auto indexAt = [&](Value offset) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), offset);
  };
  Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                      laneInSubgroup, constI64(0));
  ifThen(first, [&] {
    for (int64_t k = 0; k < count; ++k)
      memref::StoreOp::create(
          b, loc, sums[k], workgroup,
          ValueRange{indexAt(
              addI(region, addI(constI64(k * stride), subgroupInRow)))});
  });
  gpu::BarrierOp::create(b, loc);
  int64_t width = readWidth();
  auto readType = VectorType::get({width}, f32);
  SmallVector<Value> totals;
  for (int64_t k = 0; k < count; ++k) {
    Value total;
    for (int64_t s = 0; s < subgroups; s += width) {
      Value parts = vector::LoadOp::create(
          b, loc, readType, workgroup,
          ValueRange{indexAt(addI(region, constI64(k * stride + s)))},
          /*nontemporal=*/false, llvm::MaybeAlign(width * 4));
      for (int64_t j = 0; j < width; ++j) {
        Value part =
            vector::ExtractOp::create(b, loc, parts, ArrayRef<int64_t>{j});
        total = total ? combine(total, part) : part;
      }
    }
    totals.push_back(total);
  }
  if (!half)
    gpu::BarrierOp::create(b, loc);
  return totals;
}

SmallVector<Value> KernelEmitter::keyMasks(int64_t rank) {
  SmallVector<Value> masks;
  int64_t width = layout.vectorWidth;
  Value keyStart = splat(constI64(layout.width - rank), width);
  for (int64_t c = 0; c < layout.chunks; ++c) {
    Value isKey = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge,
                                        elementIndex[c], keyStart);
    masks.push_back(
        arith::AndIOp::create(b, loc, isKey, splat(chunkActive[c], width)));
  }
  return masks;
}
