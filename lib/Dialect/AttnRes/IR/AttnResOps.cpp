//===- AttnResOps.cpp - attnres operations: syntax and verifiers ----------===//
//
// Every verifier rule of docs/DialectGuide.md is checked here, and each
// diagnostic names the operand or result it is about and the rule it breaks, so
// that a user reading it does not need to know the verifier's internals.
//
//===----------------------------------------------------------------------===//

#include "attnres/Dialect/AttnRes/IR/AttnResOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"

#include <cmath>

using namespace mlir;
using namespace mlir::attnres;

#include "attnres/Dialect/AttnRes/IR/AttnResEnums.cpp.inc"

bool mlir::attnres::isSupportedValueType(Type type) {
  return type.isBF16() || type.isF16() || type.isF32();
}

bool mlir::attnres::isOpOnBuffers(Operation *op) {
  return isa<ForwardIntoOp, BackwardIntoOp, PartitionReduceIntoOp>(op);
}

LogicalResult mlir::attnres::refuseOpsOnBuffers(Operation *root,
                                                StringRef pass) {
  WalkResult result = root->walk([&](Operation *op) {
    if (!isOpOnBuffers(op))
      return WalkResult::advance();
    op->emitError() << pass << " lowers the attnres ops on tensors; '"
                    << op->getName()
                    << "' is an op on buffers, what bufferization makes of "
                       "one: lower the module before bufferizing it";
    return WalkResult::interrupt();
  });
  return failure(result.wasInterrupted());
}

//===----------------------------------------------------------------------===//
// Custom syntax
//===----------------------------------------------------------------------===//

/// `sources(%a, %b : T)` (one type for all, or one per source) or
/// `packed(%v : T)`.
static ParseResult
parseSourceList(OpAsmParser &parser,
                SmallVectorImpl<OpAsmParser::UnresolvedOperand> &operands,
                SmallVectorImpl<Type> &types, UnitAttr &packed) {
  if (succeeded(parser.parseOptionalKeyword("packed"))) {
    packed = parser.getBuilder().getUnitAttr();
    OpAsmParser::UnresolvedOperand operand;
    Type type;
    if (parser.parseLParen() || parser.parseOperand(operand) ||
        parser.parseColonType(type) || parser.parseRParen())
      return failure();
    operands.push_back(operand);
    types.push_back(type);
    return success();
  }
  if (parser.parseKeyword("sources", " or 'packed'") || parser.parseLParen())
    return failure();
  if (succeeded(parser.parseOptionalRParen()))
    return success();
  SMLoc typesLoc;
  if (parser.parseOperandList(operands) || parser.parseColon() ||
      parser.getCurrentLocation(&typesLoc) || parser.parseTypeList(types) ||
      parser.parseRParen())
    return failure();
  if (types.size() == 1 && operands.size() > 1)
    types.append(operands.size() - 1, types.front());
  if (types.size() != operands.size())
    return parser.emitError(typesLoc)
           << "expected one type for all " << operands.size()
           << " sources or one type per source, got " << types.size();
  return success();
}

static void printSourceList(OpAsmPrinter &printer, Operation *,
                            OperandRange sources, TypeRange types,
                            UnitAttr packed) {
  printer << (packed ? "packed(" : "sources(");
  printer << sources;
  if (!sources.empty()) {
    printer << " : ";
    if (llvm::all_equal(types))
      printer << types.front();
    else
      llvm::interleaveComma(types, printer);
  }
  printer << ")";
}

/// The result types of attnres.backward: one per source gradient, then the
/// query gradient, then one per weight that is present.
static ParseResult parseGradientTypes(OpAsmParser &parser, TypeRange sources,
                                      Type keyNormWeight, Type outputNormWeight,
                                      SmallVectorImpl<Type> &gradSources,
                                      Type &gradQuery, Type &gradKeyNormWeight,
                                      Type &gradOutputNormWeight) {
  SmallVector<Type> types;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseArrow() || parser.parseTypeList(types))
    return failure();
  size_t expected =
      sources.size() + 1 + (keyNormWeight ? 1 : 0) + (outputNormWeight ? 1 : 0);
  if (types.size() != expected)
    return parser.emitError(loc)
           << "expected " << expected
           << " result types (one per source gradient, the query gradient, "
              "then one per weight gradient), got "
           << types.size();
  ArrayRef<Type> rest(types);
  gradSources.append(rest.begin(), rest.begin() + sources.size());
  rest = rest.drop_front(sources.size());
  gradQuery = rest.front();
  rest = rest.drop_front();
  if (keyNormWeight) {
    gradKeyNormWeight = rest.front();
    rest = rest.drop_front();
  }
  if (outputNormWeight)
    gradOutputNormWeight = rest.front();
  return success();
}

static void printGradientTypes(OpAsmPrinter &printer, Operation *op, TypeRange,
                               Type, Type, TypeRange, Type, Type, Type) {
  printer << "-> ";
  llvm::interleaveComma(op->getResultTypes(), printer);
}

/// The results of attnres.forward and attnres.partition_reduce, printed as
/// one list: the output, then the lse, then the saved o_pre (a float tensor)
/// and its residual (an integer tensor), each optional.
static ParseResult parseResultList(OpAsmParser &parser, Type &output, Type &lse,
                                   Type &oPre, Type &residual,
                                   size_t minTypes) {
  SmallVector<Type> types;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseArrow() || parser.parseTypeList(types))
    return failure();
  if (types.size() < minTypes || types.size() > 4)
    return parser.emitError(loc)
           << "expected " << minTypes
           << " to 4 result types (output, lse, o_pre, o_pre residual), got "
           << types.size();
  output = types[0];
  if (types.size() > 1)
    lse = types[1];
  for (Type type :
       ArrayRef<Type>(types).drop_front(std::min<size_t>(2, types.size()))) {
    auto tensor = dyn_cast<RankedTensorType>(type);
    bool isResidual = tensor && tensor.getElementType().isInteger();
    Type &slot = isResidual ? residual : oPre;
    if (slot || (!isResidual && residual))
      return parser.emitError(loc)
             << "after the output and the lse, expected o_pre (a float "
                "tensor) and then its residual (an i8 tensor), got "
             << types.size() << " types";
    slot = type;
  }
  return success();
}

static void printResultList(OpAsmPrinter &printer, Operation *op) {
  printer << "-> ";
  llvm::interleaveComma(op->getResultTypes(), printer);
}

static ParseResult parseSavedResultTypes(OpAsmParser &parser, Type &output,
                                         Type &lse, Type &oPre,
                                         Type &residual) {
  return parseResultList(parser, output, lse, oPre, residual, 2);
}

static void printSavedResultTypes(OpAsmPrinter &printer, Operation *op, Type,
                                  Type, Type, Type) {
  printResultList(printer, op);
}

/// The result types of attnres.partition_reduce: the output, then the merged
/// lse (softmax), then the merged output before the output norm (softmax with
/// an output norm), then the residual of the 16-bit o_pre.
static ParseResult parseReduceResultTypes(OpAsmParser &parser, Type &output,
                                          Type &lse, Type &oPre,
                                          Type &residual) {
  return parseResultList(parser, output, lse, oPre, residual, 1);
}

static void printReduceResultTypes(OpAsmPrinter &printer, Operation *op, Type,
                                   Type, Type, Type) {
  printResultList(printer, op);
}

//===----------------------------------------------------------------------===//
// Shared verification of the sources, the query and the weights
//===----------------------------------------------------------------------===//

namespace {
/// What the source-side operands of a forward or backward imply.
struct SourceSignature {
  int64_t numSources; // L
  int64_t width;      // D
  int64_t rank;       // R
  int64_t numQueries; // M
  bool multiQuery;    // the query is [M, R]
  /// One source, [T..., D], packed or not.
  SmallVector<int64_t> sourceShape;
  Type sourceElement;

  /// [M?, T..., D]: the shape of o, o_pre and do.
  SmallVector<int64_t> outputShape() const {
    SmallVector<int64_t> shape;
    if (multiQuery)
      shape.push_back(numQueries);
    llvm::append_range(shape, sourceShape);
    return shape;
  }
  /// [M?, T...]: the shape of lse.
  SmallVector<int64_t> lseShape() const {
    SmallVector<int64_t> shape = outputShape();
    shape.pop_back();
    return shape;
  }
};

// The types the rules are about, gathered from an op: its operands' and
// results' types (absent optional ones null). The rules hold for any shaped
// type, so that an op form on buffers can be held to the same ones.

/// The operands a forward and a backward share.
struct SourceOperandTypes {
  TypeRange sources;
  bool packed;
  Type query, keyNormWeight, outputNormWeight;
};

/// What a forward produces, in order.
struct ForwardResultTypes {
  Type output, lse, oPre, oPreResidual;
};

/// The backward's operands past the shared ones.
struct BackwardOperandTypes {
  Type gradOutput, lse, savedOutput, savedResidual, gradLse;
  /// The source gradients accumulated into (accumulate(...)), if any.
  TypeRange accumulated = {};
};

/// What a backward produces, in order.
struct BackwardResultTypes {
  TypeRange gradSources;
  Type gradQuery, gradKeyNormWeight, gradOutputNormWeight;
};

/// A partition_reduce's operands and what it produces.
struct PartitionReduceTypes {
  Type partials, partialLse, sink, outputNormWeight;
  Type output, lse, oPre, oPreResidual;
  /// What the op calls what it produces, in the messages.
  StringRef produced = "result";
};
} // namespace

/// The type of `value`, null for an absent one.
static Type typeOf(Value value) { return value ? value.getType() : Type(); }

/// Whether a forward saving `save` returns o_pre (save(o_pre) or
/// save(o_pre_residual), with an output norm: without one o is o_pre) and
/// o_pre's residual (save(o_pre_residual)).
static std::pair<bool, bool> forwardSaves(SaveMode save, bool outputNorm) {
  bool residual = save == SaveMode::OPreResidual;
  return {(save == SaveMode::OPre || residual) && outputNorm, residual};
}

static std::string formatShape(ArrayRef<int64_t> shape) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(shape, os, [&](int64_t dim) {
    if (ShapedType::isDynamic(dim))
      os << "?";
    else
      os << dim;
  });
  os << "]";
  return text;
}

static LogicalResult verifyValueElementType(Operation *op, Type type,
                                            StringRef what) {
  Type element = getElementTypeOrSelf(type);
  if (isSupportedValueType(element))
    return success();
  return op->emitOpError() << what << " has element type " << element
                           << "; it must be bf16, f16 or f32";
}

/// Checks a tensor against an expected shape and, when given, an exact
/// element type. A dimension the op's other operands fix (static in `shape`)
/// must be that static size: the kernels are generated for it, so a `?` there
/// would verify here and fail in a lowering. Dynamic expected dimensions (the
/// tokens) match anything.
static LogicalResult verifyShapedLike(Operation *op, Type type,
                                      ArrayRef<int64_t> shape, Type elementType,
                                      StringRef what, StringRef layout) {
  auto shaped = cast<ShapedType>(type);
  if (shaped.getRank() != static_cast<int64_t>(shape.size()) ||
      failed(verifyCompatibleShape(shaped.getShape(), shape)))
    return op->emitOpError() << what << " must be " << layout << " = "
                             << formatShape(shape) << ", got " << type;
  for (auto [dim, expected] : llvm::enumerate(shape))
    if (!ShapedType::isDynamic(expected) && shaped.isDynamicDim(dim))
      return op->emitOpError()
             << what << " must be " << layout << " = " << formatShape(shape)
             << ", got " << type << ": dimension " << dim
             << " must be static (the op's other operands fix it to "
             << expected << ")";
  if (elementType && shaped.getElementType() != elementType)
    return op->emitOpError() << what << " must have element type "
                             << elementType << ", got " << type;
  return success();
}

/// The residual of a 16-bit o_pre (`savedType`): i8, two elements a byte,
/// so [..., D / 2] for an even D.
static LogicalResult verifyResidual(Operation *op, Type residualType,
                                    Type savedType, StringRef what,
                                    StringRef layout) {
  auto saved = cast<ShapedType>(savedType);
  Type element = saved.getElementType();
  if (!element.isBF16() && !element.isF16())
    return op->emitOpError()
           << what << " is the residual of a 16-bit o_pre (bf16 or f16), "
           << "but o_pre is " << saved;
  int64_t width = saved.getShape().back();
  if (ShapedType::isDynamic(width) || width % 2 != 0)
    return op->emitOpError()
           << what << " packs two elements a byte: the width D of o_pre "
           << saved << " must be static and even";
  SmallVector<int64_t> shape(saved.getShape());
  shape.back() = width / 2;
  return verifyShapedLike(op, residualType, shape,
                          IntegerType::get(op->getContext(), 8), what, layout);
}

static FailureOr<SourceSignature>
verifySources(Operation *op, const SourceOperandTypes &operands) {
  TypeRange sources = operands.sources;
  bool packed = operands.packed;
  SourceSignature sig;
  if (sources.empty())
    return op->emitOpError("requires at least one source (L >= 1), got none");
  if (packed && sources.size() != 1)
    return op->emitOpError() << "packed sources must be exactly one tensor "
                                "[L, T..., D], got "
                             << sources.size();

  auto first = cast<ShapedType>(sources.front());
  for (auto [index, source] : llvm::enumerate(sources)) {
    if (source != first)
      return op->emitOpError()
             << "source #" << index << " has type " << source
             << " but source #0 has type " << first
             << ": all sources must have the same shape and element type";
  }
  if (failed(verifyValueElementType(op, first, "source")))
    return failure();

  if (packed) {
    if (first.getRank() < 2)
      return op->emitOpError()
             << "packed source must have rank >= 2 ([L, T..., D]), got "
             << first;
    if (first.isDynamicDim(0))
      return op->emitOpError()
             << "packed source count L (leading dimension) must be static, got "
             << first;
    sig.numSources = first.getDimSize(0);
    if (sig.numSources < 1)
      return op->emitOpError("requires at least one source (L >= 1), got a "
                             "packed source dimension of 0");
    sig.sourceShape.assign(first.getShape().begin() + 1,
                           first.getShape().end());
  } else {
    if (first.getRank() < 1)
      return op->emitOpError()
             << "source must have rank >= 1 ([T..., D]), got " << first;
    sig.numSources = sources.size();
    sig.sourceShape.assign(first.getShape().begin(), first.getShape().end());
  }
  sig.sourceElement = first.getElementType();
  if (sig.numSources > kMaxSources)
    return op->emitOpError() << "source count L = " << sig.numSources
                             << " is out of range [1, " << kMaxSources << "]";
  if (ShapedType::isDynamic(sig.sourceShape.back()))
    return op->emitOpError()
           << "source width D (last dimension) must be static, got " << first;
  sig.width = sig.sourceShape.back();
  if (sig.width < 1)
    return op->emitOpError() << "source width D must be >= 1, got " << first;
  if (sig.width > kMaxWidth)
    return op->emitOpError() << "source width D = " << sig.width
                             << " is out of range [1, " << kMaxWidth << "]";

  auto queryType = cast<ShapedType>(operands.query);
  if (queryType.getRank() != 1 && queryType.getRank() != 2)
    return op->emitOpError()
           << "query must be [R] or [M, R], got " << queryType;
  if (!queryType.hasStaticShape())
    return op->emitOpError()
           << "query shape must be static (M and R are static), got "
           << queryType;
  if (failed(verifyValueElementType(op, queryType, "query")))
    return failure();
  sig.multiQuery = queryType.getRank() == 2;
  sig.rank = queryType.getShape().back();
  sig.numQueries = sig.multiQuery ? queryType.getDimSize(0) : 1;
  if (sig.rank < 1)
    return op->emitOpError()
           << "query rank R = " << sig.rank << " must be at least 1";
  if (sig.rank > sig.width)
    return op->emitOpError()
           << "query rank R = " << sig.rank
           << " exceeds the source width D = " << sig.width
           << " (the key is the last R coordinates of a source)";
  if (sig.numQueries < 1 || sig.numQueries > kMaxQueries)
    return op->emitOpError() << "query count M = " << sig.numQueries
                             << " is out of range [1, " << kMaxQueries << "]";

  if (Type keyNormWeight = operands.keyNormWeight) {
    if (failed(verifyShapedLike(op, keyNormWeight, {sig.rank}, Type(),
                                "key_norm weight", "[R]")) ||
        failed(verifyValueElementType(op, keyNormWeight, "key_norm weight")))
      return failure();
  }
  if (operands.outputNormWeight) {
    auto weightType = cast<ShapedType>(operands.outputNormWeight);
    bool perQuery = weightType.getRank() == 2;
    if (perQuery && !sig.multiQuery)
      return op->emitOpError()
             << "output_norm weight must be [D] = " << formatShape(sig.width)
             << " for a single [R] query, got " << weightType;
    SmallVector<int64_t> expected;
    if (perQuery)
      expected.push_back(sig.numQueries);
    expected.push_back(sig.width);
    if (failed(verifyShapedLike(op, weightType, expected, Type(),
                                "output_norm weight",
                                perQuery ? "[M, D]" : "[D]")) ||
        failed(verifyValueElementType(op, weightType, "output_norm weight")))
      return failure();
  }
  return sig;
}

static LogicalResult verifyNormAttrs(Operation *op, double eps, double scale) {
  if (!std::isfinite(eps) || eps <= 0.0)
    return op->emitOpError() << "eps must be finite and > 0, got " << eps;
  if (!std::isfinite(scale))
    return op->emitOpError() << "scale must be finite, got " << scale;
  return success();
}

#define ATTNRES_SOURCE_ACCESSORS(OP)                                           \
  int64_t OP::getNumSourceValues() {                                           \
    if (!getPacked())                                                          \
      return getSources().size();                                              \
    return cast<ShapedType>(getSources().front().getType()).getDimSize(0);     \
  }                                                                            \
  int64_t OP::getWidth() {                                                     \
    return cast<ShapedType>(getSources().front().getType()).getShape().back(); \
  }                                                                            \
  int64_t OP::getRank() {                                                      \
    return cast<ShapedType>(getQuery().getType()).getShape().back();           \
  }                                                                            \
  int64_t OP::getNumQueries() {                                                \
    return isMultiQuery()                                                      \
               ? cast<ShapedType>(getQuery().getType()).getDimSize(0)          \
               : 1;                                                            \
  }                                                                            \
  bool OP::isMultiQuery() {                                                    \
    return cast<ShapedType>(getQuery().getType()).getRank() == 2;              \
  }

ATTNRES_SOURCE_ACCESSORS(ForwardOp)
ATTNRES_SOURCE_ACCESSORS(BackwardOp)
ATTNRES_SOURCE_ACCESSORS(ForwardIntoOp)
ATTNRES_SOURCE_ACCESSORS(BackwardIntoOp)
#undef ATTNRES_SOURCE_ACCESSORS

/// One source's type, [T..., D]: a packed operand's without its leading L;
/// for an op on buffers, a dense buffer in the operand's memory space.
template <typename OpT> static auto oneSourceType(OpT op) {
  Value first = op.getSources().front();
  ArrayRef<int64_t> shape = cast<ShapedType>(first.getType()).getShape();
  if (op.getPacked())
    shape = shape.drop_front();
  if constexpr (std::is_same_v<decltype(op.getSourceType()), MemRefType>) {
    auto type = cast<MemRefType>(first.getType());
    return MemRefType::get(shape, type.getElementType(),
                           MemRefLayoutAttrInterface(), type.getMemorySpace());
  } else {
    return cast<RankedTensorType>(first.getType()).clone(shape);
  }
}

RankedTensorType ForwardOp::getSourceType() { return oneSourceType(*this); }
RankedTensorType BackwardOp::getSourceType() { return oneSourceType(*this); }
MemRefType ForwardIntoOp::getSourceType() { return oneSourceType(*this); }
MemRefType BackwardIntoOp::getSourceType() { return oneSourceType(*this); }

//===----------------------------------------------------------------------===//
// ForwardOp
//===----------------------------------------------------------------------===//

/// The operand types a forward and a backward share.
template <typename OpT> static SourceOperandTypes sourceOperandTypes(OpT op) {
  return {op.getSources().getTypes(), op.getPacked(), op.getQuery().getType(),
          typeOf(op.getKeyNormWeight()), typeOf(op.getOutputNormWeight())};
}

/// The rules forward and backward share: sources, query, weights, eps and
/// scale.
template <typename OpT>
static FailureOr<SourceSignature>
verifySourcesAndAttrs(OpT op, const SourceOperandTypes &operands) {
  FailureOr<SourceSignature> sig = verifySources(op, operands);
  if (failed(sig) || failed(verifyNormAttrs(op, op.getEps().convertToDouble(),
                                            op.getScale().convertToDouble())))
    return failure();
  return sig;
}

/// A forward's rules, for its operands and what it produces.
template <typename OpT>
static LogicalResult verifyForward(OpT op, const SourceOperandTypes &operands,
                                   const ForwardResultTypes &results) {
  FailureOr<SourceSignature> sig = verifySourcesAndAttrs(op, operands);
  if (failed(sig))
    return failure();
  SaveMode save = op.getSave();

  StringRef outputLayout = sig->multiQuery ? "[M, T..., D]" : "[T..., D]";
  StringRef lseLayout = sig->multiQuery ? "[M, T...]" : "[T...]";
  SmallVector<int64_t> outputShape = sig->outputShape();
  if (failed(verifyShapedLike(op, results.output, outputShape, Type(), "output",
                              outputLayout)))
    return failure();
  Type sourceElement = sig->sourceElement;
  Type outputElement = cast<ShapedType>(results.output).getElementType();
  if (outputElement != sourceElement && !outputElement.isF32())
    return op.emitOpError()
           << "output element type must be the source element "
              "type "
           << sourceElement << " or f32 (an FP32 partial), got "
           << outputElement;

  Type f32 = Float32Type::get(op.getContext());
  if (failed(verifyShapedLike(op, results.lse, sig->lseShape(), f32, "lse",
                              lseLayout)))
    return failure();

  auto [savesOPre, withResidual] =
      forwardSaves(save, static_cast<bool>(operands.outputNormWeight));
  if (savesOPre && !results.oPre)
    return op.emitOpError() << "with save(" << stringifySaveMode(save)
                            << ") and an output norm, the forward must return "
                               "o_pre as its third result";
  if (!savesOPre && results.oPre)
    return op.emitOpError("o_pre is a result only with save(o_pre) or "
                          "save(o_pre_residual) and an output norm (without "
                          "an output norm, o is o_pre)");
  if (results.oPre && results.oPre != results.output)
    return op.emitOpError() << "o_pre must have the type of the output "
                            << results.output << ", got " << results.oPre;
  if (withResidual && !results.oPreResidual)
    return op.emitOpError("with save(o_pre_residual), the forward must return "
                          "the residual of o_pre (i8, [M?, T..., D/2]) as its "
                          "last result");
  if (!withResidual && results.oPreResidual)
    return op.emitOpError("the o_pre residual is a result only with "
                          "save(o_pre_residual)");
  if (withResidual &&
      failed(verifyResidual(
          op, results.oPreResidual, results.output, "the o_pre residual",
          sig->multiQuery ? "[M, T..., D/2]" : "[T..., D/2]")))
    return failure();
  return success();
}

LogicalResult ForwardOp::verify() {
  return verifyForward(*this, sourceOperandTypes(*this),
                       {getOutput().getType(), getLse().getType(),
                        typeOf(getOPre()), typeOf(getOPreResidual())});
}

//===----------------------------------------------------------------------===//
// BackwardOp
//===----------------------------------------------------------------------===//

/// A parameter gradient has the parameter's shape and either its element
/// type or f32 (an FP32 partial sum over a block of tokens).
static LogicalResult verifyParameterGradient(Operation *op, Type parameter,
                                             Type grad, StringRef name) {
  auto parameterType = cast<ShapedType>(parameter);
  auto gradType = cast<ShapedType>(grad);
  if (gradType.getShape() != parameterType.getShape() ||
      (gradType.getElementType() != parameterType.getElementType() &&
       !gradType.getElementType().isF32()))
    return op->emitOpError()
           << name << " gradient must have the type of the " << name << " "
           << parameterType << " or its shape in f32 (an FP32 partial), got "
           << gradType;
  return success();
}

/// A backward's rules, for its operands and what it produces.
template <typename OpT>
static LogicalResult verifyBackward(OpT op, const SourceOperandTypes &sources,
                                    const BackwardOperandTypes &operands,
                                    const BackwardResultTypes &results) {
  FailureOr<SourceSignature> sig = verifySourcesAndAttrs(op, sources);
  if (failed(sig))
    return failure();

  StringRef outputLayout = sig->multiQuery ? "[M, T..., D]" : "[T..., D]";
  SmallVector<int64_t> outputShape = sig->outputShape();
  Type f32 = Float32Type::get(op.getContext());
  if (failed(verifyShapedLike(op, operands.gradOutput, outputShape, Type(),
                              "grad (the gradient of the output)",
                              outputLayout)) ||
      failed(verifyValueElementType(op, operands.gradOutput,
                                    "grad (the gradient of the output)")))
    return failure();
  if (failed(verifyShapedLike(op, operands.lse, sig->lseShape(), f32,
                              "lse (the forward's log-sum-exp)",
                              sig->multiQuery ? "[M, T...]" : "[T...]")))
    return failure();
  if (Type saved = operands.savedOutput) {
    if (failed(verifyShapedLike(op, saved, outputShape, Type(),
                                "saved (the forward's o_pre)", outputLayout)) ||
        failed(
            verifyValueElementType(op, saved, "saved (the forward's o_pre)")))
      return failure();
  }
  if (Type residual = operands.savedResidual) {
    if (!operands.savedOutput)
      return op.emitOpError("residual(...) is the residual of the saved o_pre: "
                            "it needs saved(...)");
    if (failed(verifyResidual(
            op, residual, operands.savedOutput, "residual (of the saved o_pre)",
            sig->multiQuery ? "[M, T..., D/2]" : "[T..., D/2]")))
      return failure();
  }

  if (Type gradLse = operands.gradLse)
    if (failed(verifyShapedLike(op, gradLse, sig->lseShape(), f32,
                                "grad_lse (the gradient of the forward's lse)",
                                sig->multiQuery ? "[M, T...]" : "[T...]")))
      return failure();

  if (results.gradSources.size() != sources.sources.size())
    return op.emitOpError()
           << "expects one source gradient per source operand ("
           << sources.sources.size() << "), got " << results.gradSources.size();
  for (auto [index, pair] :
       llvm::enumerate(llvm::zip(sources.sources, results.gradSources))) {
    auto [source, grad] = pair;
    if (source != grad)
      return op.emitOpError() << "source gradient #" << index
                              << " must have the type of source #" << index
                              << " " << source << ", got " << grad;
  }
  if (!operands.accumulated.empty()) {
    if (operands.accumulated.size() != results.gradSources.size())
      return op.emitOpError()
             << "accumulate(...) takes one gradient per source operand ("
             << results.gradSources.size() << "), got "
             << operands.accumulated.size();
    for (auto [index, pair] : llvm::enumerate(
             llvm::zip(operands.accumulated, results.gradSources))) {
      auto [accumulated, grad] = pair;
      if (accumulated != grad)
        return op.emitOpError()
               << "accumulated gradient #" << index
               << " must have the type of source gradient #" << index << " "
               << grad << ", got " << accumulated;
    }
  }
  if (failed(verifyParameterGradient(op, sources.query, results.gradQuery,
                                     "query")))
    return failure();

  auto verifyWeightGrad = [&](Type weight, Type grad,
                              StringRef name) -> LogicalResult {
    if (!weight && grad)
      return op.emitOpError() << "has a " << name << " weight gradient but no "
                              << name << " weight";
    if (weight && !grad)
      return op.emitOpError() << "has a " << name << " weight but no " << name
                              << " weight gradient result";
    if (weight)
      return verifyParameterGradient(op, weight, grad,
                                     (name + " weight").str());
    return success();
  };
  if (failed(verifyWeightGrad(sources.keyNormWeight, results.gradKeyNormWeight,
                              "key_norm")) ||
      failed(verifyWeightGrad(sources.outputNormWeight,
                              results.gradOutputNormWeight, "output_norm")))
    return failure();
  return success();
}

LogicalResult BackwardOp::verify() {
  return verifyBackward(
      *this, sourceOperandTypes(*this),
      {getGradOutput().getType(), getLse().getType(), typeOf(getSavedOutput()),
       typeOf(getSavedResidual()), typeOf(getGradLse()),
       getAccumulated().getTypes()},
      {getGradSources().getTypes(), getGradQuery().getType(),
       typeOf(getGradKeyNormWeight()), typeOf(getGradOutputNormWeight())});
}

//===----------------------------------------------------------------------===//
// PartitionReduceOp
//===----------------------------------------------------------------------===//

int64_t PartitionReduceOp::getNumPartitions() {
  return getPartials().getType().getDimSize(0);
}

/// A partition_reduce's rules, for its operands and what it produces.
template <typename OpT>
static LogicalResult verifyPartitionReduce(OpT op,
                                           const PartitionReduceTypes &types) {
  auto partials = cast<ShapedType>(types.partials);
  StringRef kind = stringifyReduceKind(op.getKind());
  bool softmax = op.getKind() == ReduceKind::Softmax;
  int64_t minRank = softmax ? 2 : 1;
  if (partials.getRank() < minRank)
    return op.emitOpError()
           << "partials must be " << (softmax ? "[P, T..., D]" : "[P, S...]")
           << " (rank >= " << minRank << ") for the " << kind << " kind, got "
           << partials;
  if (partials.isDynamicDim(0))
    return op.emitOpError()
           << "partition count P (leading dimension of partials) must be "
              "static, got "
           << partials;
  if (partials.getDimSize(0) < 1)
    return op.emitOpError()
           << "requires at least one partition (P >= 1), got " << partials;
  if (partials.getDimSize(0) > kMaxSources)
    return op.emitOpError() << "partition count P = " << partials.getDimSize(0)
                            << " is out of range [1, " << kMaxSources << "]";
  if (!partials.getElementType().isF32())
    return op.emitOpError()
           << "partials must be f32 (partials are FP32), got " << partials;

  Type f32 = Float32Type::get(op.getContext());
  ArrayRef<int64_t> resultShape = partials.getShape().drop_front();
  if (!softmax) {
    if (types.partialLse)
      return op.emitOpError("the sum kind takes no lse(...) operand");
    if (types.sink)
      return op.emitOpError("the sum kind takes no sink(...) operand");
    if (types.outputNormWeight)
      return op.emitOpError("the sum kind takes no output_norm(...) operand");
    if (types.lse || types.oPre || types.oPreResidual)
      return op.emitOpError("the sum kind has one result, the sum");
    return failure(failed(verifyShapedLike(op, types.output, resultShape,
                                           Type(), "output", "[S...]")) ||
                   failed(verifyValueElementType(op, types.output, "output")));
  }

  if (partials.isDynamicDim(partials.getRank() - 1))
    return op.emitOpError() << "the row width D (last dimension of partials) "
                               "must be static for the softmax kind, got "
                            << partials;
  if (partials.getShape().back() > kMaxWidth)
    return op.emitOpError() << "row width D = " << partials.getShape().back()
                            << " is out of range [1, " << kMaxWidth << "]";
  SmallVector<int64_t> rowShape(resultShape.drop_back());
  if (!types.partialLse)
    return op.emitOpError("the softmax kind requires the partitions' "
                          "lse(...) operand");
  auto partialLse = cast<ShapedType>(types.partialLse);
  if (partialLse.getRank() >= 1 && !partialLse.isDynamicDim(0) &&
      partialLse.getDimSize(0) != partials.getDimSize(0))
    return op.emitOpError()
           << "lse has " << partialLse.getDimSize(0)
           << " partitions but partials have " << partials.getDimSize(0);
  SmallVector<int64_t> partialLseShape{partials.getDimSize(0)};
  llvm::append_range(partialLseShape, rowShape);
  if (failed(verifyShapedLike(op, partialLse, partialLseShape, f32, "lse",
                              "[P, T...]")))
    return failure();
  if (types.sink &&
      failed(verifyShapedLike(op, types.sink, rowShape, f32, "sink", "[T...]")))
    return failure();
  if (!types.lse)
    return op.emitOpError("the softmax kind has two results, the merged output "
                          "and the merged lse");
  if (failed(verifyShapedLike(op, types.output, resultShape, Type(), "output",
                              "[T..., D]")) ||
      failed(verifyValueElementType(op, types.output, "output")) ||
      failed(verifyShapedLike(op, types.lse, rowShape, f32, "merged lse",
                              "[T...]")))
    return failure();

  Type weight = types.outputNormWeight;
  if (types.oPre && !weight)
    return op.emitOpError()
           << "o_pre is a " << types.produced
           << " only with an output_norm(...) operand (without one the "
              "output is o_pre)";
  if (Type residual = types.oPreResidual) {
    if (weight && !types.oPre)
      return op.emitOpError()
             << "with an output norm, the o_pre residual needs the o_pre "
             << types.produced << " it belongs to";
    if (failed(verifyResidual(op, residual, types.output, "the o_pre residual",
                              "[T..., D/2]")))
      return failure();
  }
  if (!weight)
    return success();
  if (failed(verifyNormAttrs(op, op.getEps().convertToDouble(), 1.0)))
    return failure();
  auto weightType = cast<ShapedType>(weight);
  int64_t width = resultShape.back();
  SmallVector<int64_t> expected{width};
  StringRef layout = "[D]";
  if (weightType.getRank() == 2) {
    if (resultShape.size() < 2)
      return op.emitOpError()
             << "output_norm weight must be [D] = " << formatShape(width)
             << " for a result of rank " << resultShape.size() << ", got "
             << weightType;
    expected.insert(expected.begin(), resultShape.front());
    layout = "[K, D] (K the leading result dimension)";
  }
  if (failed(verifyShapedLike(op, weightType, expected, Type(),
                              "output_norm weight", layout)) ||
      failed(verifyValueElementType(op, weightType, "output_norm weight")))
    return failure();
  if (types.oPre && types.oPre != types.output)
    return op.emitOpError() << "o_pre must have the type of the output "
                            << types.output << ", got " << types.oPre;
  return success();
}

LogicalResult PartitionReduceOp::verify() {
  return verifyPartitionReduce(
      *this,
      {getPartials().getType(), typeOf(getPartialLse()), typeOf(getSink()),
       typeOf(getOutputNormWeight()), getOutput().getType(), typeOf(getLse()),
       typeOf(getOPre()), typeOf(getOPreResidual())});
}

//===----------------------------------------------------------------------===//
// The ops on buffers
//===----------------------------------------------------------------------===//

/// `outs[index]`, null past its end.
static Value outAt(ValueRange outs, size_t index) {
  return index < outs.size() ? outs[index] : Value();
}

bool mlir::attnres::hasContiguousRows(MemRefType type) {
  SmallVector<int64_t> strides;
  int64_t offset;
  return succeeded(type.getStridesAndOffset(strides, offset)) &&
         (strides.empty() || strides.back() == 1);
}

/// The rules of the buffers themselves. The kernels read and write whole
/// rows: every buffer's rows must be contiguous. And they read the operands
/// while they write `outs`: a buffer written must be no other buffer of the
/// op (the tensors an op returns are new values).
static LogicalResult verifyBuffers(Operation *op, OperandRange outs) {
  unsigned firstOut = op->getNumOperands() - outs.size();
  auto name = [&](unsigned index) {
    return index < firstOut ? "operand #" + std::to_string(index)
                            : "outs #" + std::to_string(index - firstOut);
  };
  // The kernels read and write whole rows with vector accesses: a row's
  // elements must be adjacent. Where the rows lie (the other strides, the
  // offset) is the lowering's to handle or refuse: a tile of a buffer is a
  // view whose leading strides are the whole buffer's.
  for (auto [index, operand] : llvm::enumerate(op->getOperands())) {
    auto type = cast<MemRefType>(operand.getType());
    if (!hasContiguousRows(type))
      return op->emitOpError()
             << "takes buffers whose rows are contiguous (a strided "
                "layout with stride 1 in the last dimension); "
             << name(index) << " is " << type;
  }
  for (auto [index, out] : llvm::enumerate(outs))
    for (auto [other, operand] : llvm::enumerate(op->getOperands()))
      if (other != firstOut + index && operand == out)
        return op->emitOpError()
               << "writes outs #" << index << ", which is also its "
               << name(other)
               << ": a buffer it writes must be no other buffer of the op";
  return success();
}

static LogicalResult verifyOutCount(Operation *op, ValueRange outs,
                                    size_t expected, const Twine &what) {
  if (outs.size() == expected)
    return success();
  return op->emitOpError() << "writes " << expected << " buffer"
                           << (expected == 1 ? "" : "s") << " (" << what
                           << "), but outs has " << outs.size();
}

/// Reads every operand but `outs`, writes `outs`, and reads the first
/// `readOuts` of them too (an accumulating backward's source gradients).
static void bufferEffects(
    Operation *op, OperandRange outs,
    SmallVectorImpl<SideEffects::EffectInstance<MemoryEffects::Effect>>
        &effects,
    unsigned readOuts = 0) {
  // outs are the last operands.
  unsigned firstOut = op->getNumOperands() - outs.size();
  for (OpOperand &operand : op->getOpOperands()) {
    unsigned number = operand.getOperandNumber();
    if (number >= firstOut && number < firstOut + readOuts)
      effects.emplace_back(MemoryEffects::Read::get(), &operand,
                           SideEffects::DefaultResource::get());
    effects.emplace_back(
        number < firstOut
            ? static_cast<MemoryEffects::Effect *>(MemoryEffects::Read::get())
            : MemoryEffects::Write::get(),
        &operand, SideEffects::DefaultResource::get());
  }
}

Value ForwardIntoOp::getOutputBuffer() { return outAt(getOuts(), 0); }
Value ForwardIntoOp::getLseBuffer() { return outAt(getOuts(), 1); }
Value ForwardIntoOp::getOPreBuffer() {
  auto [oPre, residual] =
      forwardSaves(getSave(), static_cast<bool>(getOutputNormWeight()));
  return oPre ? outAt(getOuts(), 2) : Value();
}
Value ForwardIntoOp::getOPreResidualBuffer() {
  auto [oPre, residual] =
      forwardSaves(getSave(), static_cast<bool>(getOutputNormWeight()));
  return residual ? outAt(getOuts(), oPre ? 3 : 2) : Value();
}

LogicalResult ForwardIntoOp::verify() {
  if (failed(verifyBuffers(*this, getOuts())))
    return failure();
  auto [oPre, residual] =
      forwardSaves(getSave(), static_cast<bool>(getOutputNormWeight()));
  if (failed(verifyOutCount(*this, getOuts(), 2 + oPre + residual,
                            Twine("o, lse") + (oPre ? ", o_pre" : "") +
                                (residual ? ", the o_pre residual" : ""))))
    return failure();
  return verifyForward(*this, sourceOperandTypes(*this),
                       {typeOf(getOutputBuffer()), typeOf(getLseBuffer()),
                        typeOf(getOPreBuffer()),
                        typeOf(getOPreResidualBuffer())});
}

/// The source gradients among a backward's outs: one per source operand.
static size_t gradSourceCount(BackwardIntoOp op) {
  return op.getSources().size();
}

ValueRange BackwardIntoOp::getGradSourceBuffers() {
  size_t count = gradSourceCount(*this);
  if (getOuts().size() < count)
    return {};
  return getOuts().take_front(count);
}
Value BackwardIntoOp::getGradQueryBuffer() {
  return outAt(getOuts(), gradSourceCount(*this));
}
Value BackwardIntoOp::getGradKeyNormWeightBuffer() {
  if (!getKeyNormWeight())
    return {};
  return outAt(getOuts(), gradSourceCount(*this) + 1);
}
Value BackwardIntoOp::getGradOutputNormWeightBuffer() {
  if (!getOutputNormWeight())
    return {};
  return outAt(getOuts(),
               gradSourceCount(*this) + 1 + (getKeyNormWeight() ? 1 : 0));
}

LogicalResult BackwardIntoOp::verify() {
  if (failed(verifyBuffers(*this, getOuts())))
    return failure();
  bool keyNorm = static_cast<bool>(getKeyNormWeight());
  bool outputNorm = static_cast<bool>(getOutputNormWeight());
  if (failed(verifyOutCount(
          *this, getOuts(), gradSourceCount(*this) + 1 + keyNorm + outputNorm,
          Twine("a gradient per source operand, the query's") +
              (keyNorm ? ", the key_norm weight's" : "") +
              (outputNorm ? ", the output_norm weight's" : ""))))
    return failure();
  return verifyBackward(
      *this, sourceOperandTypes(*this),
      {getGradOutput().getType(), getLse().getType(), typeOf(getSavedOutput()),
       typeOf(getSavedResidual()), typeOf(getGradLse())},
      {getGradSourceBuffers().getTypes(), typeOf(getGradQueryBuffer()),
       typeOf(getGradKeyNormWeightBuffer()),
       typeOf(getGradOutputNormWeightBuffer())});
}

int64_t PartitionReduceIntoOp::getNumPartitions() {
  return cast<MemRefType>(getPartials().getType()).getDimSize(0);
}

/// Past the output and the merged lse, a softmax merge's outs hold o_pre (a
/// float buffer) and its residual (an integer one), each optional.
static bool isResidualBuffer(Value buffer) {
  return isa<IntegerType>(cast<MemRefType>(buffer.getType()).getElementType());
}

Value PartitionReduceIntoOp::getOutputBuffer() { return outAt(getOuts(), 0); }
Value PartitionReduceIntoOp::getLseBuffer() {
  return getKind() == ReduceKind::Softmax ? outAt(getOuts(), 1) : Value();
}
Value PartitionReduceIntoOp::getOPreBuffer() {
  Value third =
      getKind() == ReduceKind::Softmax ? outAt(getOuts(), 2) : Value();
  return third && (getOuts().size() == 4 || !isResidualBuffer(third)) ? third
                                                                      : Value();
}
Value PartitionReduceIntoOp::getOPreResidualBuffer() {
  if (getKind() != ReduceKind::Softmax || getOuts().size() < 3)
    return {};
  Value last = getOuts().back();
  return getOuts().size() == 4 || isResidualBuffer(last) ? last : Value();
}

LogicalResult PartitionReduceIntoOp::verify() {
  if (failed(verifyBuffers(*this, getOuts())))
    return failure();
  if (getKind() == ReduceKind::Sum) {
    if (failed(verifyOutCount(*this, getOuts(), 1, "the sum")))
      return failure();
  } else if (getOuts().size() < 2 || getOuts().size() > 4) {
    return emitOpError() << "writes the merged output, the merged lse and "
                            "optionally o_pre and its residual (2 to 4 "
                            "buffers), but outs has "
                         << getOuts().size();
  }
  return verifyPartitionReduce(
      *this,
      {getPartials().getType(), typeOf(getPartialLse()), typeOf(getSink()),
       typeOf(getOutputNormWeight()), typeOf(getOutputBuffer()),
       typeOf(getLseBuffer()), typeOf(getOPreBuffer()),
       typeOf(getOPreResidualBuffer()), "buffer in outs"});
}

#define GET_OP_CLASSES
#include "attnres/Dialect/AttnRes/IR/AttnResOps.cpp.inc"
