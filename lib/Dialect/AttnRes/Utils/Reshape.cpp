//===- Reshape.cpp - token-dimension reshapes -----------------------------===//

#include "attnres/Dialect/AttnRes/Utils/Reshape.h"

#include "mlir/Dialect/Arith/Utils/Utils.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Utils/StaticValueUtils.h"

using namespace mlir;

/// Merges dimensions [start, start + count) of `value` into one: the token
/// dimensions become N. With count == 0 a unit dimension is inserted.
Value mlir::attnres::flattenDims(OpBuilder &b, Location loc, Value value,
                                 int64_t start, int64_t count) {
  auto type = cast<RankedTensorType>(value.getType());
  int64_t rank = type.getRank();
  if (count == 1)
    return value;
  SmallVector<ReassociationIndices> groups;
  if (count == 0) {
    // Insert a unit dimension at `start`, grouped with a neighbour.
    SmallVector<int64_t> shape(type.getShape());
    shape.insert(shape.begin() + start, 1);
    auto expanded = RankedTensorType::get(shape, type.getElementType());
    for (int64_t dim = 0; dim < rank; ++dim) {
      int64_t outDim = dim < start ? dim : dim + 1;
      groups.push_back({outDim});
    }
    if (rank > 0) {
      if (start < rank)
        groups[start].insert(groups[start].begin(), start);
      else
        groups.back().push_back(start);
    }
    SmallVector<OpFoldResult> outputShape =
        tensor::getMixedSizes(b, loc, value);
    outputShape.insert(outputShape.begin() + start, b.getIndexAttr(1));
    return tensor::ExpandShapeOp::create(b, loc, expanded, value, groups,
                                         outputShape);
  }
  for (int64_t dim = 0; dim < start; ++dim)
    groups.push_back({dim});
  ReassociationIndices merged;
  for (int64_t dim = start; dim < start + count; ++dim)
    merged.push_back(dim);
  groups.push_back(merged);
  for (int64_t dim = start + count; dim < rank; ++dim)
    groups.push_back({dim});
  return tensor::CollapseShapeOp::create(b, loc, value, groups);
}

/// The inverse of flattenDims: dimension `start` of `value` becomes
/// `sizes` (the original token dimensions) and the result gets `type`.
Value mlir::attnres::unflattenDims(OpBuilder &b, Location loc, Value value,
                                   int64_t start, ArrayRef<OpFoldResult> sizes,
                                   RankedTensorType type) {
  auto valueType = cast<RankedTensorType>(value.getType());
  int64_t rank = valueType.getRank();
  int64_t count = sizes.size();
  Value result = value;
  if (count == 0) {
    SmallVector<ReassociationIndices> groups;
    for (int64_t dim = 0; dim < rank; ++dim) {
      if (dim == start)
        continue;
      groups.push_back({dim});
    }
    if (!groups.empty()) {
      if (start < rank - 1)
        groups[start].insert(groups[start].begin(), start);
      else
        groups.back().push_back(start);
    }
    result = tensor::CollapseShapeOp::create(b, loc, value, groups);
  } else if (count > 1) {
    SmallVector<ReassociationIndices> groups;
    SmallVector<OpFoldResult> outputShape;
    SmallVector<OpFoldResult> valueSizes = tensor::getMixedSizes(b, loc, value);
    int64_t outDim = 0;
    for (int64_t dim = 0; dim < rank; ++dim) {
      if (dim == start) {
        ReassociationIndices group;
        for (int64_t i = 0; i < count; ++i)
          group.push_back(outDim++);
        groups.push_back(group);
        llvm::append_range(outputShape, sizes);
      } else {
        groups.push_back({outDim++});
        outputShape.push_back(valueSizes[dim]);
      }
    }
    // A size known to be constant must be an attribute: expand_shape
    // requires its static result dimensions to be given that way.
    for (OpFoldResult &size : outputShape)
      if (std::optional<int64_t> constant = getConstantIntValue(size))
        size = b.getIndexAttr(*constant);
    SmallVector<int64_t> staticShape;
    for (OpFoldResult size : outputShape) {
      std::optional<int64_t> constant = getConstantIntValue(size);
      staticShape.push_back(constant ? *constant : ShapedType::kDynamic);
    }
    auto expanded =
        RankedTensorType::get(staticShape, valueType.getElementType());
    int64_t dynamicTokenDims = llvm::count_if(
        sizes, [](OpFoldResult size) { return !getConstantIntValue(size); });
    if (dynamicTokenDims == 0 && valueType.isDynamicDim(start)) {
      // Every token size is known: so is their product, which expand_shape
      // wants to see in the source type.
      int64_t product = 1;
      for (OpFoldResult size : sizes)
        product *= *getConstantIntValue(size);
      SmallVector<int64_t> known(valueType.getShape());
      known[start] = product;
      value = tensor::CastOp::create(b, loc, valueType.clone(known), value);
    }
    dynamicTokenDims = llvm::count_if(
        sizes, [](OpFoldResult size) { return !getConstantIntValue(size); });
    if (dynamicTokenDims <= 1) {
      result = tensor::ExpandShapeOp::create(b, loc, expanded, value, groups,
                                             outputShape);
    } else {
      // LLVM 22's expand-strided-metadata crashes on an expand_shape that
      // splits one dimension into several dynamic ones
      // (llvm/llvm-project#186830, fixed in LLVM 23); a reshape by a shape
      // tensor expresses the same thing and lowers.
      SmallVector<Value> shapeValues;
      for (OpFoldResult size : outputShape)
        shapeValues.push_back(getValueOrCreateConstantIndexOp(b, loc, size));
      Value shape = tensor::FromElementsOp::create(b, loc, shapeValues);
      result = tensor::ReshapeOp::create(b, loc, expanded, value, shape);
    }
  }
  if (result.getType() != type)
    result = tensor::CastOp::create(b, loc, type, result);
  return result;
}
