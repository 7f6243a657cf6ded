//===- attnres-numerics.cpp - JIT the attnres ops, check against float64 --===//
//
// For every case of a suite: write a module holding one attnres op on random
// inputs, optionally run extra passes on it (--pre-pipeline, for the split
// and tiling passes), lower it with attnres-lower-to-llvm-cpu-pipeline,
// JIT-run it with mlir::ExecutionEngine on inputs rounded to the storage
// type, and compare every result with the float64 reference of Reference.h
// computed on the same rounded inputs.
//
// Outputs are poisoned with NaN before each run (every element must be
// written), each case is run twice (results must be bit-identical), and the
// driver prints one line per case and a summary:
//   suite <name>: <passed> of <total> cases passed
// It exits 1 if any case failed.
//
//===----------------------------------------------------------------------===//

#include "Reference.h"

#include "attnres/InitAll.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/ExecutionEngine/ExecutionEngine.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <sstream>

using namespace mlir;
namespace ref = mlir::attnres::reference;

//===----------------------------------------------------------------------===//
// Tolerances: the one place they are stated.
//===----------------------------------------------------------------------===//
//
// Errors are max |x - ref| / max magnitude(ref) over a tensor (Reference.h).
// * f32 storage: FP32 accumulation of at most a few thousand terms has a
//   typical relative error of a few 1e-7 and a worst case near 1e-6 at
//   D = 2048; 1e-5 leaves an order of magnitude of margin while catching any
//   wrong term, which moves results by far more.
// * bf16 storage: inputs are rounded to bf16 and the float64 reference uses
//   the rounded inputs, so what remains is the rounding of every stored
//   result (and saved intermediate) to bf16, 2^-9 = 2e-3 relative, plus FP32
//   accumulation; 1e-2 bounds that.
static constexpr double kToleranceF32 = 1e-5;
static constexpr double kToleranceBF16 = 1e-2;
// * The o_pre a bf16 value and its residual decode to is within ulp/28 of
//   the FP32 o_pre, ulp <= 2^-7 of the value: 2.8e-4 relative. Without the
//   residual (or with a wrong one) the error is up to 2^-9 of the largest
//   values, 2e-3.
static constexpr double kToleranceResidual = 3e-4;
// * FP32 gradients (f32 parameters) of a bf16 backward given the residual:
//   the reference uses the same decoded o_pre, so only FP32 accumulation
//   remains, as in the f32 suites. Ignoring the residual moves them by
//   1e-5 to 1e-3 (delta cancels against <do, v>).
static constexpr double kToleranceResidualF32Grad = kToleranceF32;
// * An lse gradient at logits |z| ~ 1e4 (f32): the FP32 logit is off by a few
//   ulp(1e4) ~ 1e-3, so p_s is off by that relatively, and scale * p_s * dlse
//   (which, unlike p_s * (<do, v_s> - delta), does not cancel for a one-hot
//   softmax) carries it into dv and dq: 2.7e-5 of their magnitude measured.
static constexpr double kToleranceLargeLogitGradLse = 1e-4;

//===----------------------------------------------------------------------===//
// Storage types and buffers
//===----------------------------------------------------------------------===//

namespace {

/// Element types of buffers: values in f32 or bf16, and i8 for the packed
/// residual of a bf16 o_pre (two signed 4-bit values a byte).
enum class Elem { F32, BF16, I8 };

const char *name(Elem elem) {
  switch (elem) {
  case Elem::F32:
    return "f32";
  case Elem::BF16:
    return "bf16";
  case Elem::I8:
    return "i8";
  }
  return "?";
}

uint16_t toBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (std::isnan(value))
    return 0x7fc0;
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float fromBF16(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, 4);
  return value;
}

/// A host buffer and the memref descriptor that points at it.
class Buffer {
public:
  Buffer(Elem elem, std::vector<int64_t> shape)
      : elem(elem), shape(std::move(shape)) {
    count = 1;
    for (int64_t dim : this->shape)
      count *= dim;
    storage.assign((count * bytesPerElement() + 7) / 8 + 1, 0);
    int64_t rank = this->shape.size();
    descriptor.assign(3 + 2 * rank, 0);
    descriptor[0] = reinterpret_cast<int64_t>(storage.data());
    descriptor[1] = reinterpret_cast<int64_t>(storage.data());
    int64_t stride = 1;
    for (int64_t dim = rank - 1; dim >= 0; --dim) {
      descriptor[3 + dim] = this->shape[dim];
      descriptor[3 + rank + dim] = stride;
      stride *= this->shape[dim];
    }
    descriptorAddress = descriptor.data();
  }

  Elem elem;
  std::vector<int64_t> shape;
  int64_t count;

  size_t bytesPerElement() const {
    return elem == Elem::F32 ? 4 : elem == Elem::BF16 ? 2 : 1;
  }

  double get(int64_t i) const {
    if (elem == Elem::F32)
      return reinterpret_cast<const float *>(storage.data())[i];
    if (elem == Elem::I8)
      return reinterpret_cast<const int8_t *>(storage.data())[i];
    return fromBF16(reinterpret_cast<const uint16_t *>(storage.data())[i]);
  }
  /// Stores `value` rounded to the storage type and returns what was stored.
  /// i8 poison (NaN) is 0x88: two residuals of -8, which no encoder writes.
  double set(int64_t i, double value) {
    float single = static_cast<float>(value);
    if (elem == Elem::F32) {
      reinterpret_cast<float *>(storage.data())[i] = single;
    } else if (elem == Elem::I8) {
      reinterpret_cast<int8_t *>(storage.data())[i] =
          std::isnan(value) ? static_cast<int8_t>(0x88)
                            : static_cast<int8_t>(value);
    } else {
      reinterpret_cast<uint16_t *>(storage.data())[i] = toBF16(single);
    }
    return get(i);
  }
  std::vector<double> setAll(const std::vector<double> &values) {
    std::vector<double> stored;
    for (int64_t i = 0; i < count; ++i)
      stored.push_back(set(i, values[i]));
    return stored;
  }
  void poison() {
    for (int64_t i = 0; i < count; ++i)
      set(i, std::nan(""));
  }
  bool sameBits(const Buffer &other) const {
    return std::memcmp(storage.data(), other.storage.data(),
                       count * bytesPerElement()) == 0;
  }
  /// The argument the C interface of the kernel takes: a pointer to the
  /// descriptor.
  void **argument() { return reinterpret_cast<void **>(&descriptorAddress); }

  std::string memrefType(const std::vector<int64_t> &printedShape) const {
    std::string text = "memref<";
    for (int64_t dim : printedShape)
      text += (dim < 0 ? std::string("?") : std::to_string(dim)) + "x";
    return text + name(elem) + ">";
  }

private:
  std::vector<uint64_t> storage;
  std::vector<int64_t> descriptor;
  void *descriptorAddress;
};

//===----------------------------------------------------------------------===//
// Cases
//===----------------------------------------------------------------------===//

enum class Kind { Forward, Backward, Softmax, Sum };
enum class Inputs { Normal, LargeLogits, ZeroQuery, NearZeroSources };
enum class Sink { None, NegInf, PosInf, Finite };
enum class Empty { None, Some, AllInSomeRows, All };

struct Case {
  Kind kind = Kind::Forward;
  // forward / backward
  int64_t L = 2, D = 8, R = 8, M = 1;
  bool multiQueryForm = false; // [M, R] query (always when M > 1)
  bool keyNorm = false, outputNorm = false, perQueryOutputNorm = false;
  bool packed = false;
  bool saveOPre = true; // forward: save(o_pre); backward: saved(...)
  // With saveOPre and bf16 storage: forward save(o_pre_residual), backward
  // residual(...).
  bool residual = false;
  bool gradLse = false; // backward: grad_lse(...), the lse's gradient
  // With one source (L = 1) its softmax weight is 1 whatever the rounding
  // of the logits: o (or o_pre) is the source, dq and dg are zero and,
  // with one query and no output norm, the source's gradient is do, all
  // exactly (checked bit for bit, not against the reference).
  bool exactOneSource = false;
  // backward: accumulate(...), the gradients the sources already have (the
  // source gradients are those plus the op's).
  bool accumulate = false;
  Elem storage = Elem::F32, params = Elem::F32;
  double eps = 1e-6, scale = 1.0;
  Inputs inputs = Inputs::Normal;
  // token dimensions T...; printed as '?' when dynamicTokens
  std::vector<int64_t> tokens{4};
  bool dynamicTokens = true;
  // partition_reduce
  int64_t P = 2;
  Sink sink = Sink::None;
  Empty empty = Empty::None;
  uint64_t seed = 1;

  int64_t numTokens() const {
    int64_t n = 1;
    for (int64_t t : tokens)
      n *= t;
    return n;
  }
  double tolerance() const {
    return storage == Elem::BF16 ? kToleranceBF16 : kToleranceF32;
  }
  std::string describe() const;
};

std::string tokensText(const std::vector<int64_t> &tokens) {
  std::string text = "[";
  for (size_t i = 0; i < tokens.size(); ++i)
    text += (i ? "," : "") + std::to_string(tokens[i]);
  return text + "]";
}

std::string Case::describe() const {
  std::ostringstream os;
  switch (kind) {
  case Kind::Forward:
  case Kind::Backward:
    os << (kind == Kind::Forward ? "forward" : "backward") << " L=" << L
       << " D=" << D << " R=" << R << " M=" << M
       << (multiQueryForm ? "[MR]" : "") << (keyNorm ? " g" : "")
       << (outputNorm ? (perQueryOutputNorm ? " h[MD]" : " h") : "")
       << (packed ? " packed" : " list")
       << (saveOPre ? (residual ? " o_pre+residual" : " o_pre") : " recompute")
       << (gradLse ? " dlse" : "") << (accumulate ? " accumulate" : "")
       << (exactOneSource ? " exact" : "")
       << " " << name(storage) << "/"
       << name(params) << " eps=" << eps << " scale=" << scale;
    switch (inputs) {
    case Inputs::Normal:
      break;
    case Inputs::LargeLogits:
      os << " large-logits";
      break;
    case Inputs::ZeroQuery:
      os << " zero-query";
      break;
    case Inputs::NearZeroSources:
      os << " near-zero-sources";
      break;
    }
    break;
  case Kind::Softmax: {
    const char *sinks[] = {"none", "-inf", "+inf", "finite"};
    const char *empties[] = {"none", "some", "all-in-some-rows", "all"};
    os << "softmax-merge P=" << P << " D=" << D
       << " sink=" << sinks[static_cast<int>(sink)]
       << " empty=" << empties[static_cast<int>(empty)]
       << (outputNorm ? (perQueryOutputNorm ? " h[KD]" : " h") : "") << " "
       << name(storage);
    break;
  }
  case Kind::Sum:
    os << "sum P=" << P << " " << name(storage);
    break;
  }
  os << " T=" << tokensText(tokens) << (dynamicTokens ? "?" : "");
  return os.str();
}

/// An f64 attribute in hexadecimal: exact, and valid MLIR for any value.
std::string f64Attr(double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, 8);
  char text[32];
  std::snprintf(text, sizeof(text), "0x%016llX : f64",
                static_cast<unsigned long long>(bits));
  return text;
}

//===----------------------------------------------------------------------===//
// Kernel modules
//===----------------------------------------------------------------------===//

/// Collects the arguments of the kernel function and the IR that turns them
/// into tensors or writes results into them.
//===----------------------------------------------------------------------===//
// The residual of a bf16 o_pre (save(o_pre_residual)), on the host
//===----------------------------------------------------------------------===//

/// 2^e for the FP32 value `x` = 1.f * 2^e, or 0 where x is zero,
/// FP32-subnormal or not finite (no residual there).
float residualPowerOfTwo(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  uint32_t field = bits & 0x7F800000u;
  if (field == 0 || field == 0x7F800000u)
    return 0.0f;
  float power;
  std::memcpy(&power, &field, 4);
  return power;
}

/// The residual n in [-7, 7] of `exact` rounded to bf16 (`rounded`): the
/// dialect's encoding, ulp(x) = 2^(e - 7).
int encodeResidual(double exact, double rounded) {
  float power = residualPowerOfTwo(static_cast<float>(rounded));
  if (power == 0.0f || std::fabs(rounded) >= 0x1p127)
    return 0;
  double steps = (exact - rounded) / power * (14.0 * 128.0);
  // Ties to even (the default rounding mode).
  return static_cast<int>(std::nearbyint(std::clamp(steps, -7.0, 7.0)));
}

/// The o_pre that `rounded` and its residual n stand for.
double decodeResidual(double rounded, int n) {
  float power = residualPowerOfTwo(static_cast<float>(rounded));
  return rounded + n * (static_cast<double>(power) / (14.0 * 128.0));
}

/// Residual `element` of a packed i8 buffer, sign-extended.
int residualAt(const Buffer &packed, int64_t element) {
  auto byte = static_cast<int8_t>(packed.get(element / 2));
  return element % 2
             ? byte >> 4
             : static_cast<int8_t>(static_cast<uint8_t>(byte) << 4) >> 4;
}

class KernelWriter {
public:
  /// An input memref, read as a tensor.
  std::string input(const std::string &argName, const Buffer &buffer,
                    const std::vector<int64_t> &printedShape) {
    std::string memref = buffer.memrefType(printedShape);
    std::string tensor = "tensor" + memref.substr(6);
    args.push_back("%" + argName + ": " + memref);
    body << "  %t_" << argName << " = bufferization.to_tensor %" << argName
         << " restrict : " << memref << " to " << tensor << "\n";
    return "%t_" + argName;
  }
  /// An output memref that result `value` is written into.
  void output(const std::string &argName, const Buffer &buffer,
              const std::vector<int64_t> &printedShape,
              const std::string &value) {
    std::string memref = buffer.memrefType(printedShape);
    std::string tensor = "tensor" + memref.substr(6);
    args.push_back("%" + argName + ": " + memref);
    stores << "  bufferization.materialize_in_destination " << value
           << " in restrict writable %" << argName << " : (" << tensor << ", "
           << memref << ") -> ()\n";
  }
  /// Slice `index` of the packed tensor `packed` ([L, T..., D]), without the
  /// leading dimension.
  std::string slice(const std::string &packed, const std::string &packedType,
                    const std::string &sliceType, int64_t index,
                    const std::vector<int64_t> &slicePrintedShape) {
    size_t numTokenDims = slicePrintedShape.size() - 1;
    std::string sizes = "1";
    for (size_t dim = 0; dim < slicePrintedShape.size(); ++dim)
      sizes += ", " + (slicePrintedShape[dim] < 0
                           ? dimOf(packed, packedType, dim + 1)
                           : std::to_string(slicePrintedShape[dim]));
    std::string offsets = std::to_string(index), strides = "1";
    for (size_t dim = 1; dim <= numTokenDims + 1; ++dim)
      offsets += ", 0", strides += ", 1";
    std::string name = "%slice" + std::to_string(counter++);
    body << "  " << name << " = tensor.extract_slice " << packed << "["
         << offsets << "] [" << sizes << "] [" << strides
         << "] : " << packedType << " to " << sliceType << "\n";
    return name;
  }
  /// Concatenates tensors [T..., D] into one [L, T..., D] and returns it.
  std::string concat(const std::vector<std::string> &values,
                     const std::string &type, const std::string &packedType,
                     const std::vector<int64_t> &printedShape) {
    // [T..., D] -> [1, T..., D]: the unit dimension joins the first group.
    std::string groups = "[0, 1]";
    for (size_t dim = 2; dim <= printedShape.size(); ++dim)
      groups += ", [" + std::to_string(dim) + "]";
    std::string sizes = "1", unitType = "tensor<1x" + type.substr(7);
    for (size_t dim = 0; dim < printedShape.size(); ++dim)
      sizes +=
          ", " + (printedShape[dim] < 0 ? dimOf(values[0], type, dim)
                                        : std::to_string(printedShape[dim]));
    std::string list, types;
    for (size_t i = 0; i < values.size(); ++i) {
      std::string name = "%unit" + std::to_string(counter++);
      stores << "  " << name << " = tensor.expand_shape " << values[i] << " ["
             << groups << "] output_shape [" << sizes << "] : " << type
             << " into " << unitType << "\n";
      list += (i ? ", " : "") + name;
      types += (i ? ", " : "") + unitType;
    }
    std::string name = "%packed" + std::to_string(counter++);
    stores << "  " << name << " = tensor.concat dim(0) " << list << " : ("
           << types << ") -> " << packedType << "\n";
    return name;
  }
  static std::string tensorType(const Buffer &buffer,
                                const std::vector<int64_t> &printedShape) {
    return "tensor" + buffer.memrefType(printedShape).substr(6);
  }
  std::string module(const std::string &op) const {
    std::ostringstream os;
    os << "func.func @kernel(";
    for (size_t i = 0; i < args.size(); ++i)
      os << (i ? ", " : "") << args[i];
    os << ") attributes {llvm.emit_c_interface} {\n"
       << body.str() << op << stores.str() << "  return\n}\n";
    return os.str();
  }

private:
  std::string dimOf(const std::string &value, const std::string &type,
                    size_t dim) {
    std::string index = "%dimidx" + std::to_string(counter++);
    std::string name = "%dim" + std::to_string(counter++);
    std::ostringstream &os = value.rfind("%r#", 0) == 0 ? stores : body;
    os << "  " << index << " = arith.constant " << dim << " : index\n"
       << "  " << name << " = tensor.dim " << value << ", " << index << " : "
       << type << "\n";
    return name;
  }

  std::vector<std::string> args;
  std::ostringstream body, stores;
  int counter = 0;
};

/// The shape as printed in the IR: token dimensions '?' when dynamic.
std::vector<int64_t> printed(const Case &c, std::vector<int64_t> lead,
                             std::vector<int64_t> trail) {
  for (int64_t t : c.tokens)
    lead.push_back(c.dynamicTokens ? -1 : t);
  lead.insert(lead.end(), trail.begin(), trail.end());
  return lead;
}

std::vector<int64_t> actual(const Case &c, std::vector<int64_t> lead,
                            std::vector<int64_t> trail) {
  lead.insert(lead.end(), c.tokens.begin(), c.tokens.end());
  lead.insert(lead.end(), trail.begin(), trail.end());
  return lead;
}

//===----------------------------------------------------------------------===//
// Running and comparing
//===----------------------------------------------------------------------===//

struct Check {
  std::string what;
  Buffer *buffer;
  ref::Tensor expected;
  /// For a packed residual (`buffer`, i8): the bf16 values it belongs to;
  /// the check then compares the decoded o_pre with `expected`.
  const Buffer *rounded = nullptr;
  /// 0: the case's tolerance.
  double tolerance = 0.0;
  /// Every value must equal `expected` exactly (the tolerance is unused).
  bool exact = false;
};

/// A check that `buffer` holds exactly `values`.
Check exactCheck(const std::string &what, Buffer *buffer,
                 std::vector<double> values) {
  Check check{what, buffer, {values, values}};
  check.exact = true;
  return check;
}

/// The values a check compares: the buffer's, or the o_pre that a residual
/// and its bf16 values decode to.
std::vector<double> checkedValues(const Buffer &buffer, const Buffer *rounded) {
  std::vector<double> values;
  if (!rounded) {
    for (int64_t i = 0; i < buffer.count; ++i)
      values.push_back(buffer.get(i));
    return values;
  }
  for (int64_t i = 0; i < rounded->count; ++i)
    values.push_back(decodeResidual(rounded->get(i), residualAt(buffer, i)));
  return values;
}

/// max |x - ref| / max magnitude; infinity when a finite reference value
/// gets a non-finite result or a non-finite reference value is missed.
double relativeError(const std::vector<double> &values,
                     const ref::Tensor &expected) {
  double denominator = 0.0;
  for (double magnitude : expected.magnitude)
    if (std::isfinite(magnitude))
      denominator = std::max(denominator, magnitude);
  double worst = 0.0;
  for (size_t i = 0; i < values.size(); ++i) {
    double x = values[i], r = expected.value[i];
    if (!std::isfinite(r)) {
      if (!(x == r))
        return INFINITY;
      continue;
    }
    if (!std::isfinite(x))
      return INFINITY;
    worst = std::max(worst, std::fabs(x - r));
  }
  return denominator > 0.0 ? worst / denominator : worst;
}

class Runner {
public:
  Runner(MLIRContext &context, std::vector<std::string> prePipelines,
         bool verbose)
      : context(context), prePipelines(std::move(prePipelines)),
        verbose(verbose), engines(this->prePipelines.size() + 1) {}

  /// The --pre-pipeline variants; each case runs the plain lowering and then
  /// every variant, whose results are compared with the plain ones as well
  /// as with the reference.
  ArrayRef<std::string> variants() const { return prePipelines; }

  /// Compiles `source` (cached) after the pre-pipeline `variant` (or none
  /// for kPlain) and runs its kernel on `arguments`.
  static constexpr int kPlain = -1;
  LogicalResult run(const std::string &source, std::vector<Buffer *> arguments,
                    int variant, std::string &error) {
    ExecutionEngine *engine = compile(source, variant, error);
    if (!engine)
      return failure();
    std::vector<void *> packed;
    for (Buffer *buffer : arguments)
      packed.push_back(buffer->argument());
    if (llvm::Error err = engine->invokePacked("_mlir_ciface_kernel", packed)) {
      error = llvm::toString(std::move(err));
      return failure();
    }
    return success();
  }

private:
  ExecutionEngine *compile(const std::string &source, int variant,
                           std::string &error) {
    std::map<std::string, std::unique_ptr<ExecutionEngine>> &cache =
        engines[variant + 1];
    auto cached = cache.find(source);
    if (cached != cache.end())
      return cached->second.get();
    if (verbose)
      llvm::outs() << source << "\n", llvm::outs().flush();
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(source, &context);
    if (!module) {
      error = "the generated module does not parse:\n" + source;
      return nullptr;
    }
    PassManager pm(&context);
    if (variant != kPlain &&
        failed(parsePassPipeline(prePipelines[variant],
                                 pm.nest<func::FuncOp>()))) {
      error = "bad --pre-pipeline: " + prePipelines[variant];
      return nullptr;
    }
    attnres::buildLowerToLLVMCPUPipeline(pm);
    if (failed(pm.run(*module))) {
      error = "lowering failed for:\n" + source;
      return nullptr;
    }
    // The kernels run for milliseconds; compiling them is what costs, so
    // LLVM does not optimize (no IR passes, the fast instruction selector and
    // register allocator). The level is set on the target machine given to
    // the engine: ExecutionEngineOptions::jitCodeGenOptLevel does not reach
    // the machine the engine compiles with (LLVM 22), whose default level
    // ran loop strength reduction over every loop of the split modules and
    // took most of the suites' time.
    auto machineBuilder = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!machineBuilder) {
      error = "no JIT target: " + llvm::toString(machineBuilder.takeError());
      return nullptr;
    }
    machineBuilder->setCodeGenOptLevel(llvm::CodeGenOptLevel::None);
    auto machine = machineBuilder->createTargetMachine();
    if (!machine) {
      error = "no JIT target: " + llvm::toString(machine.takeError());
      return nullptr;
    }
    ExecutionEngineOptions options;
    llvm::SmallVector<llvm::StringRef, 1> libraries{ATTNRES_C_RUNNER_UTILS};
    options.sharedLibPaths = libraries;
    auto engine =
        ExecutionEngine::create(*module, options, std::move(*machine));
    if (!engine) {
      error = "JIT compilation failed: " + llvm::toString(engine.takeError());
      return nullptr;
    }
    return (cache[source] = std::move(*engine)).get();
  }

  MLIRContext &context;
  std::vector<std::string> prePipelines;
  bool verbose;
  // Compiled kernels by source, for the plain lowering and each variant.
  std::vector<std::map<std::string, std::unique_ptr<ExecutionEngine>>> engines;
};

//===----------------------------------------------------------------------===//
// Inputs
//===----------------------------------------------------------------------===//

class Random {
public:
  explicit Random(uint64_t seed) : engine(seed) {}
  double normal() { return distribution(engine); }
  std::vector<double> normals(int64_t count, double mean, double stddev) {
    std::vector<double> values;
    for (int64_t i = 0; i < count; ++i)
      values.push_back(mean + stddev * normal());
    return values;
  }
  int64_t below(int64_t bound) { return engine() % bound; }

private:
  std::mt19937_64 engine;
  std::normal_distribution<double> distribution;
};

/// Builds the reference problem and fills the input buffers with the same
/// (rounded) values.
struct AttnResData {
  ref::Problem problem;
  std::unique_ptr<Buffer> sources; // [L, T..., D]
  std::unique_ptr<Buffer> query, keyNorm, outputNorm;

  /// The kernel arguments every attnres op starts with, in operand order.
  std::vector<Buffer *> leadingArguments() const {
    std::vector<Buffer *> arguments{sources.get(), query.get()};
    if (keyNorm)
      arguments.push_back(keyNorm.get());
    if (outputNorm)
      arguments.push_back(outputNorm.get());
    return arguments;
  }
};

AttnResData makeAttnResData(const Case &c, Random &random) {
  AttnResData data;
  ref::Problem &pb = data.problem;
  pb.L = c.L, pb.N = c.numTokens(), pb.D = c.D, pb.R = c.R, pb.M = c.M;
  pb.hasKeyNorm = c.keyNorm, pb.hasOutputNorm = c.outputNorm;
  pb.perQueryOutputNorm = c.perQueryOutputNorm;
  pb.eps = c.eps, pb.scale = c.scale;

  double sourceScale = c.inputs == Inputs::NearZeroSources ? 1e-4 : 1.0;
  std::vector<double> v = random.normals(c.L * pb.N * c.D, 0.0, sourceScale);
  // Queries of norm ~2 give logits of a few units; large-logit cases scale
  // them to |z| ~ 1e4.
  double queryScale = 2.0 / std::sqrt(static_cast<double>(c.R));
  if (c.inputs == Inputs::LargeLogits)
    queryScale = 1e4 / std::sqrt(static_cast<double>(c.R)) / std::fabs(c.scale);
  std::vector<double> q = random.normals(c.M * c.R, 0.0, queryScale);
  if (c.inputs == Inputs::ZeroQuery)
    q.assign(q.size(), 0.0);

  // Sources always travel in one [L, T..., D] buffer; the list form takes
  // slices of it inside the kernel (a kernel with hundreds of memref
  // arguments takes LLVM seconds to compile).
  data.sources = std::make_unique<Buffer>(c.storage, actual(c, {c.L}, {c.D}));
  pb.v = data.sources->setAll(v);
  std::vector<int64_t> queryShape{c.R};
  if (c.multiQueryForm)
    queryShape.insert(queryShape.begin(), c.M);
  data.query = std::make_unique<Buffer>(c.params, queryShape);
  pb.q = data.query->setAll(q);
  if (c.keyNorm) {
    data.keyNorm =
        std::make_unique<Buffer>(c.params, std::vector<int64_t>{c.R});
    pb.g = data.keyNorm->setAll(random.normals(c.R, 1.0, 0.2));
  }
  if (c.outputNorm) {
    std::vector<int64_t> shape{c.D};
    if (c.perQueryOutputNorm)
      shape.insert(shape.begin(), c.M);
    data.outputNorm = std::make_unique<Buffer>(c.params, shape);
    pb.h = data.outputNorm->setAll(
        random.normals(data.outputNorm->count, 1.0, 0.2));
  }
  return data;
}

/// The operands shared by forward and backward, as IR.
std::string sourceOperands(const Case &c, AttnResData &data, KernelWriter &w) {
  std::ostringstream os;
  std::vector<int64_t> packedShape = printed(c, {c.L}, {c.D});
  std::string packed = w.input("v", *data.sources, packedShape);
  if (c.packed) {
    os << "packed(" << packed << " : "
       << KernelWriter::tensorType(*data.sources, packedShape) << ")";
  } else {
    std::vector<int64_t> shape = printed(c, {}, {c.D});
    std::string sliceType = KernelWriter::tensorType(*data.sources, shape);
    os << "sources(";
    for (int64_t l = 0; l < c.L; ++l)
      os << (l ? ", " : "")
         << w.slice(packed,
                    KernelWriter::tensorType(*data.sources, packedShape),
                    sliceType, l, shape);
    os << " : " << sliceType << ")";
  }
  os << " query(" << w.input("q", *data.query, data.query->shape) << " : "
     << KernelWriter::tensorType(*data.query, data.query->shape) << ")";
  if (data.keyNorm)
    os << " key_norm(" << w.input("g", *data.keyNorm, data.keyNorm->shape)
       << " : " << KernelWriter::tensorType(*data.keyNorm, data.keyNorm->shape)
       << ")";
  if (data.outputNorm)
    os << " output_norm("
       << w.input("h", *data.outputNorm, data.outputNorm->shape) << " : "
       << KernelWriter::tensorType(*data.outputNorm, data.outputNorm->shape)
       << ")";
  return os.str();
}

std::string normAttrs(const Case &c) {
  return "{eps = " + f64Attr(c.eps) + ", scale = " + f64Attr(c.scale) + "}";
}

std::vector<int64_t> perQueryLead(const Case &c) {
  return c.multiQueryForm ? std::vector<int64_t>{c.M} : std::vector<int64_t>{};
}

//===----------------------------------------------------------------------===//
// One case
//===----------------------------------------------------------------------===//

struct Outcome {
  bool passed = true;
  std::string detail;
};

/// Runs the kernel twice (poisoning outputs each time), checks that the two
/// runs agree bit for bit, then compares each result with the reference.
/// With --pre-pipeline variants, every variant's kernel is run twice and
/// checked that way, and also compared with the plain kernel's results (the
/// split and tiling passes must not change results beyond FP32 rounding).
Outcome runAndCompare(Runner &runner, const Case &c, const std::string &source,
                      std::vector<Buffer *> arguments,
                      std::vector<Check> checks) {
  auto runOnce = [&](int variant, std::string &error) {
    for (Check &check : checks)
      check.buffer->poison();
    return runner.run(source, arguments, variant, error);
  };
  auto snapshot = [&]() {
    std::vector<std::unique_ptr<Buffer>> copies;
    for (Check &check : checks)
      copies.push_back(std::make_unique<Buffer>(*check.buffer));
    return copies;
  };

  Outcome outcome;
  std::ostringstream os;
  std::vector<std::unique_ptr<Buffer>> plain;
  std::vector<int> variants{Runner::kPlain};
  if (!runner.variants().empty()) {
    std::string error;
    if (failed(runOnce(Runner::kPlain, error)))
      return {false, error};
    plain = snapshot();
    variants.clear();
    for (size_t v = 0; v < runner.variants().size(); ++v)
      variants.push_back(v);
  }
  for (int variant : variants) {
    std::string error;
    if (failed(runOnce(variant, error)))
      return {false, error};
    std::vector<std::unique_ptr<Buffer>> firstRun = snapshot();
    if (failed(runOnce(variant, error)))
      return {false, error};
    if (variant != Runner::kPlain)
      os << " [" << runner.variants()[variant] << "]";
    for (auto [index, check] : llvm::enumerate(checks)) {
      if (!check.buffer->sameBits(*firstRun[index])) {
        outcome.passed = false;
        os << " " << check.what << ":NOT-DETERMINISTIC";
        continue;
      }
      double tolerance = check.tolerance > 0 ? check.tolerance : c.tolerance();
      std::vector<double> values = checkedValues(*check.buffer, check.rounded);
      if (check.exact) {
        int64_t differ = 0;
        for (size_t i = 0; i < values.size(); ++i)
          differ += values[i] != check.expected.value[i];
        outcome.passed &= differ == 0;
        os << " " << check.what << "="
           << (differ ? "NOT-EXACT(" + std::to_string(differ) + " of " +
                            std::to_string(values.size()) + ")(FAIL)"
                      : std::string("exact"));
        continue;
      }
      double error = relativeError(values, check.expected);
      bool ok = error <= tolerance;
      char text[96];
      if (!plain.empty()) {
        // The plain kernel's results, at the reference's magnitudes.
        const Buffer *plainRounded = nullptr;
        for (auto [other, otherCheck] : llvm::enumerate(checks))
          if (check.rounded && otherCheck.buffer == check.rounded)
            plainRounded = plain[other].get();
        ref::Tensor untransformed{checkedValues(*plain[index], plainRounded),
                                  check.expected.magnitude};
        double drift = relativeError(values, untransformed);
        ok &= drift <= tolerance;
        std::snprintf(text, sizeof(text), " %s=%.2e/%.2e%s", check.what.c_str(),
                      error, drift, ok ? "" : "(FAIL)");
      } else {
        std::snprintf(text, sizeof(text), " %s=%.2e%s", check.what.c_str(),
                      error, ok ? "" : "(FAIL)");
      }
      outcome.passed &= ok;
      os << text;
    }
  }
  outcome.detail = os.str();
  return outcome;
}

Outcome runForward(Runner &runner, const Case &c) {
  Random random(c.seed);
  AttnResData data = makeAttnResData(c, random);
  ref::Forward expected = ref::forward(data.problem);
  KernelWriter w;
  std::string operands = sourceOperands(c, data, w);
  bool savesOPre = c.saveOPre && c.outputNorm;
  std::vector<int64_t> outShape = printed(c, perQueryLead(c), {c.D});
  std::vector<int64_t> lseShape = printed(c, perQueryLead(c), {});
  std::vector<int64_t> residualShape = printed(c, perQueryLead(c), {c.D / 2});
  Buffer o(c.storage, actual(c, perQueryLead(c), {c.D}));
  Buffer lse(Elem::F32, actual(c, perQueryLead(c), {}));
  Buffer oPre(c.storage, actual(c, perQueryLead(c), {c.D}));
  Buffer residual(Elem::I8, actual(c, perQueryLead(c), {c.D / 2}));
  std::string oType = KernelWriter::tensorType(o, outShape);
  std::string types = oType + ", " + KernelWriter::tensorType(lse, lseShape);
  if (savesOPre)
    types += ", " + oType;
  if (c.residual)
    types += ", " + KernelWriter::tensorType(residual, residualShape);
  int numResults = 2 + (savesOPre ? 1 : 0) + (c.residual ? 1 : 0);
  w.output("o", o, outShape, "%r#0");
  w.output("lse", lse, lseShape, "%r#1");
  std::vector<Check> checks{{"o", &o, expected.o}, {"lse", &lse, expected.lse}};
  if (savesOPre) {
    w.output("o_pre", oPre, outShape, "%r#2");
    checks.push_back({"o_pre", &oPre, expected.oPre});
  }
  if (c.exactOneSource) {
    // Every query's o_pre is the one source.
    std::vector<double> sourceForEachQuery;
    for (int64_t m = 0; m < c.M; ++m)
      llvm::append_range(sourceForEachQuery, data.problem.v);
    if (!c.outputNorm)
      checks[0] = exactCheck("o", &o, sourceForEachQuery);
    else if (savesOPre)
      checks[2] = exactCheck("o_pre", &oPre, sourceForEachQuery);
  }
  if (c.residual) {
    w.output("residual", residual, residualShape,
             "%r#" + std::to_string(numResults - 1));
    checks.push_back({"o_pre+residual", &residual, expected.oPre,
                      savesOPre ? &oPre : &o, kToleranceResidual});
  }
  const char *save = !c.saveOPre  ? " save(lse)"
                     : c.residual ? " save(o_pre_residual)"
                                  : "";
  std::string op = "  %r:" + std::to_string(numResults) +
                   " = attnres.forward " + operands + save + " " +
                   normAttrs(c) + " -> " + types + "\n";
  std::vector<Buffer *> arguments = data.leadingArguments();
  arguments.push_back(&o);
  arguments.push_back(&lse);
  if (savesOPre)
    arguments.push_back(&oPre);
  if (c.residual)
    arguments.push_back(&residual);
  return runAndCompare(runner, c, w.module(op), arguments, checks);
}

Outcome runBackward(Runner &runner, const Case &c) {
  Random random(c.seed);
  AttnResData data = makeAttnResData(c, random);
  ref::Problem &pb = data.problem;
  KernelWriter w;
  std::string operands = sourceOperands(c, data, w);

  // The saved forward results, as the forward would have stored them.
  ref::Forward forward = ref::forward(pb);
  std::vector<int64_t> outShape = printed(c, perQueryLead(c), {c.D});
  std::vector<int64_t> lseShape = printed(c, perQueryLead(c), {});
  Buffer gradOutput(c.storage, actual(c, perQueryLead(c), {c.D}));
  Buffer lse(Elem::F32, actual(c, perQueryLead(c), {}));
  Buffer saved(c.storage, actual(c, perQueryLead(c), {c.D}));
  std::vector<double> dout =
      gradOutput.setAll(random.normals(gradOutput.count, 0.0, 1.0));
  std::vector<double> lseValues = lse.setAll(forward.lse.value);
  const std::vector<double> &exactSaved =
      c.outputNorm ? forward.oPre.value : forward.o.value;
  std::vector<double> savedValues = saved.setAll(exactSaved);
  // With the residual, the backward's o_pre is what the bf16 values and
  // their residuals decode to.
  std::vector<int64_t> residualShape = printed(c, perQueryLead(c), {c.D / 2});
  Buffer residual(Elem::I8, actual(c, perQueryLead(c), {c.D / 2}));
  if (c.residual) {
    for (int64_t i = 0; i < residual.count; ++i) {
      int low = encodeResidual(exactSaved[2 * i], savedValues[2 * i]);
      int high = encodeResidual(exactSaved[2 * i + 1], savedValues[2 * i + 1]);
      // Two's-complement nibbles (shifting a negative int is undefined).
      unsigned byte = (static_cast<unsigned>(low) & 0xFu) |
                      ((static_cast<unsigned>(high) & 0xFu) << 4);
      residual.set(i, static_cast<int8_t>(byte));
    }
    for (int64_t i = 0; i < saved.count; ++i)
      savedValues[i] = decodeResidual(savedValues[i], residualAt(residual, i));
  }
  Buffer gradLse(Elem::F32, actual(c, perQueryLead(c), {}));
  std::vector<double> dlse =
      gradLse.setAll(random.normals(gradLse.count, 0.0, 1.0));
  // The gradients the sources already have, [L, T..., D] as the sources.
  Buffer accumulated(c.storage, actual(c, {c.L}, {c.D}));
  std::vector<double> accumulatedValues;
  if (c.accumulate)
    accumulatedValues =
        accumulated.setAll(random.normals(accumulated.count, 0.0, 1.0));
  ref::Backward expected =
      ref::backward(pb, dout, lseValues, c.saveOPre ? &savedValues : nullptr,
                    c.gradLse ? &dlse : nullptr,
                    c.accumulate ? &accumulatedValues : nullptr);

  operands += " grad(" + w.input("do", gradOutput, outShape) + " : " +
              KernelWriter::tensorType(gradOutput, outShape) + ")";
  operands += " lse(" + w.input("lse", lse, lseShape) + " : " +
              KernelWriter::tensorType(lse, lseShape) + ")";
  if (c.saveOPre)
    operands += " saved(" + w.input("saved", saved, outShape) + " : " +
                KernelWriter::tensorType(saved, outShape) + ")";
  if (c.residual)
    operands += " residual(" + w.input("residual", residual, residualShape) +
                " : " + KernelWriter::tensorType(residual, residualShape) + ")";
  if (c.gradLse)
    operands += " grad_lse(" + w.input("dlse", gradLse, lseShape) + " : " +
                KernelWriter::tensorType(gradLse, lseShape) + ")";
  if (c.accumulate) {
    // One operand per source operand, as the sources: slices of one buffer,
    // or the packed buffer itself.
    std::vector<int64_t> packedShape = printed(c, {c.L}, {c.D});
    std::string packedType = KernelWriter::tensorType(accumulated, packedShape);
    std::string whole = w.input("acc", accumulated, packedShape);
    if (c.packed) {
      operands += " accumulate(" + whole + " : " + packedType + ")";
    } else {
      std::vector<int64_t> shape = printed(c, {}, {c.D});
      std::string sliceType = KernelWriter::tensorType(accumulated, shape);
      std::string values, types;
      for (int64_t l = 0; l < c.L; ++l) {
        values += (l ? ", " : "") +
                  w.slice(whole, packedType, sliceType, l, shape);
        types += (l ? ", " : "") + sliceType;
      }
      operands += " accumulate(" + values + " : " + types + ")";
    }
  }

  std::vector<Buffer *> arguments = data.leadingArguments();
  arguments.push_back(&gradOutput);
  arguments.push_back(&lse);
  if (c.saveOPre)
    arguments.push_back(&saved);
  if (c.residual)
    arguments.push_back(&residual);
  if (c.gradLse)
    arguments.push_back(&gradLse);
  if (c.accumulate)
    arguments.push_back(&accumulated);

  // Results: source gradients, then dq, dg, dh. The gradients of a source
  // list are concatenated into one [L, T..., D] output.
  std::vector<std::unique_ptr<Buffer>> results;
  std::vector<Check> checks;
  std::vector<std::string> types;
  int resultIndex = 0;
  auto addOutput = [&](const std::string &what, Elem elem,
                       std::vector<int64_t> shape,
                       std::vector<int64_t> printedShape,
                       const std::string &value, ref::Tensor expect) {
    results.push_back(std::make_unique<Buffer>(elem, shape));
    Buffer &buffer = *results.back();
    w.output("out_" + what, buffer, printedShape, value);
    arguments.push_back(&buffer);
    checks.push_back({what, &buffer, std::move(expect)});
  };
  auto nextResult = [&]() { return "%r#" + std::to_string(resultIndex++); };
  Buffer &packedSources = *data.sources;
  std::string packedType =
      KernelWriter::tensorType(packedSources, printed(c, {c.L}, {c.D}));
  if (c.packed) {
    types.push_back(packedType);
    addOutput("dv", c.storage, actual(c, {c.L}, {c.D}),
              printed(c, {c.L}, {c.D}), nextResult(), expected.dv);
  } else {
    std::string sliceType =
        KernelWriter::tensorType(packedSources, printed(c, {}, {c.D}));
    std::vector<std::string> values;
    for (int64_t l = 0; l < c.L; ++l) {
      types.push_back(sliceType);
      values.push_back(nextResult());
    }
    addOutput("dv", c.storage, actual(c, {c.L}, {c.D}),
              printed(c, {c.L}, {c.D}),
              w.concat(values, sliceType, packedType, printed(c, {}, {c.D})),
              expected.dv);
  }
  auto addParameterGrad = [&](const std::string &what, const Buffer &param,
                              ref::Tensor expect) {
    types.push_back(KernelWriter::tensorType(param, param.shape));
    addOutput(what, c.params, param.shape, param.shape, nextResult(),
              std::move(expect));
    if (c.residual && c.params == Elem::F32)
      checks.back().tolerance = kToleranceResidualF32Grad;
  };
  addParameterGrad("dq", *data.query, expected.dq);
  if (c.keyNorm)
    addParameterGrad("dg", *data.keyNorm, expected.dg);
  if (c.outputNorm)
    addParameterGrad("dh", *data.outputNorm, expected.dh);
  if (c.gradLse && c.inputs == Inputs::LargeLogits && c.storage == Elem::F32)
    for (Check &check : checks)
      check.tolerance = kToleranceLargeLogitGradLse;
  if (c.exactOneSource)
    for (Check &check : checks) {
      if (check.what == "dq" || check.what == "dg")
        check = exactCheck(check.what, check.buffer,
                           std::vector<double>(check.buffer->count, 0.0));
      else if (check.what == "dv" && c.M == 1 && !c.outputNorm)
        check = exactCheck("dv", check.buffer, dout);
    }

  std::string typeList;
  for (size_t i = 0; i < types.size(); ++i)
    typeList += (i ? ", " : "") + types[i];
  std::string op = "  %r:" + std::to_string(types.size()) +
                   " = attnres.backward " + operands + " " + normAttrs(c) +
                   " -> " + typeList + "\n";
  return runAndCompare(runner, c, w.module(op), arguments, checks);
}

Outcome runSoftmaxMerge(Runner &runner, const Case &c) {
  Random random(c.seed);
  int64_t N = c.numTokens(), P = c.P, D = c.D;
  Buffer partials(Elem::F32, actual(c, {P}, {D}));
  Buffer lse(Elem::F32, actual(c, {P}, {}));
  Buffer sink(Elem::F32, actual(c, {}, {}));
  std::vector<double> partialValues = random.normals(P * N * D, 0.0, 1.0);
  std::vector<double> lseValues = random.normals(P * N, 0.0, 3.0);
  std::vector<double> sinkValues = random.normals(N, 0.0, 3.0);
  double inf = INFINITY;
  for (int64_t n = 0; n < N; ++n) {
    bool allInRow = c.empty == Empty::All ||
                    (c.empty == Empty::AllInSomeRows && n % 2 == 0);
    for (int64_t p = 0; p < P; ++p) {
      bool emptyPartition =
          allInRow || (c.empty == Empty::Some && random.below(3) == 0);
      if (!emptyPartition)
        continue;
      // An empty partition: lse = -inf and garbage (NaN, inf) outputs.
      lseValues[p * N + n] = -inf;
      for (int64_t d = 0; d < D; ++d)
        partialValues[(p * N + n) * D + d] = d % 2 ? std::nan("") : inf;
    }
    if (c.sink == Sink::NegInf)
      sinkValues[n] = -inf;
    if (c.sink == Sink::PosInf)
      sinkValues[n] = n % 2 == 0 ? inf : sinkValues[n];
  }
  partialValues = partials.setAll(partialValues);
  lseValues = lse.setAll(lseValues);
  sinkValues = sink.setAll(sinkValues);
  ref::Merge expected =
      ref::softmaxMerge(P, N, D, partialValues, lseValues,
                        c.sink == Sink::None ? nullptr : &sinkValues);

  KernelWriter w;
  std::vector<int64_t> pShape = printed(c, {P}, {D});
  std::vector<int64_t> lShape = printed(c, {P}, {});
  std::vector<int64_t> sShape = printed(c, {}, {});
  // Arguments are declared in the order of `arguments` below.
  std::string partialsValue = w.input("p", partials, pShape);
  std::string lseValue = w.input("l", lse, lShape);
  std::string op =
      "  %r:2 = attnres.partition_reduce softmax " + partialsValue + " : " +
      KernelWriter::tensorType(partials, pShape) + " lse(" + lseValue + " : " +
      KernelWriter::tensorType(lse, lShape) + ")";
  std::vector<Buffer *> arguments{&partials, &lse};
  if (c.sink != Sink::None) {
    op += " sink(" + w.input("s", sink, sShape) + " : " +
          KernelWriter::tensorType(sink, sShape) + ")";
    arguments.push_back(&sink);
  }
  // With an output norm the merge also returns the merged rows before it.
  std::unique_ptr<Buffer> weight;
  ref::Tensor normalized;
  if (c.outputNorm) {
    int64_t K = c.perQueryOutputNorm ? c.tokens.front() : 0;
    std::vector<int64_t> shape{D};
    if (K)
      shape.insert(shape.begin(), K);
    weight = std::make_unique<Buffer>(c.params, shape);
    std::vector<double> h =
        weight->setAll(random.normals(weight->count, 1.0, 0.2));
    normalized = ref::normalizeRows(expected.o, N, D, h, K, c.eps);
    op += " output_norm(" + w.input("h", *weight, shape) + " : " +
          KernelWriter::tensorType(*weight, shape) +
          ") {eps = " + f64Attr(c.eps) + "}";
    arguments.push_back(weight.get());
  }
  Buffer o(c.storage, actual(c, {}, {D}));
  Buffer merged(Elem::F32, actual(c, {}, {}));
  Buffer oPre(c.storage, actual(c, {}, {D}));
  std::vector<int64_t> oShape = printed(c, {}, {D});
  w.output("o", o, oShape, "%r#0");
  w.output("merged", merged, sShape, "%r#1");
  std::string oType = KernelWriter::tensorType(o, oShape);
  op += " -> " + oType + ", " + KernelWriter::tensorType(merged, sShape);
  arguments.push_back(&o);
  arguments.push_back(&merged);
  std::vector<Check> checks{{"lse", &merged, expected.lse}};
  if (c.outputNorm) {
    w.output("o_pre", oPre, oShape, "%r#2");
    op += ", " + oType;
    arguments.push_back(&oPre);
    checks.push_back({"o", &o, normalized});
    checks.push_back({"o_pre", &oPre, expected.o});
  } else {
    checks.push_back({"o", &o, expected.o});
  }
  op.replace(op.find("%r:2"), 4, c.outputNorm ? "%r:3" : "%r:2");
  return runAndCompare(runner, c, w.module(op + "\n"), arguments, checks);
}

Outcome runSum(Runner &runner, const Case &c) {
  Random random(c.seed);
  int64_t S = c.numTokens();
  Buffer partials(Elem::F32, actual(c, {c.P}, {}));
  std::vector<double> values =
      partials.setAll(random.normals(partials.count, 0.0, 1.0));
  ref::Tensor expected = ref::sum(c.P, S, values);
  KernelWriter w;
  std::vector<int64_t> pShape = printed(c, {c.P}, {});
  std::vector<int64_t> oShape = printed(c, {}, {});
  Buffer out(c.storage, actual(c, {}, {}));
  std::string op = "  %r = attnres.partition_reduce sum " +
                   w.input("p", partials, pShape) + " : " +
                   KernelWriter::tensorType(partials, pShape) + " -> " +
                   KernelWriter::tensorType(out, oShape) + "\n";
  w.output("o", out, oShape, "%r");
  return runAndCompare(runner, c, w.module(op), {&partials, &out},
                       {{"sum", &out, expected}});
}

Outcome runCase(Runner &runner, const Case &c) {
  switch (c.kind) {
  case Kind::Forward:
    return runForward(runner, c);
  case Kind::Backward:
    return runBackward(runner, c);
  case Kind::Softmax:
    return runSoftmaxMerge(runner, c);
  case Kind::Sum:
    return runSum(runner, c);
  }
  return {false, "unknown case kind"};
}

//===----------------------------------------------------------------------===//
// Suites
//===----------------------------------------------------------------------===//

/// The reference matrix: L x D x R, with M, the weights, the source form,
/// the query form, the token layout and the save mode varied across it so
/// that every pair of those choices occurs.
std::vector<Case> matrix(Kind kind, Elem storage) {
  std::vector<Case> cases;
  const int64_t Ls[] = {1, 2, 7, 33, 129};
  const int64_t Ds[] = {8, 64, 769, 2048};
  int index = 0;
  for (int64_t L : Ls)
    for (int64_t D : Ds)
      for (int64_t R : {int64_t(1), D / 4, D}) {
        Case c;
        c.kind = kind;
        c.storage = storage;
        c.params =
            (storage == Elem::BF16 && index % 3 == 0) ? Elem::F32 : storage;
        c.L = L, c.D = D, c.R = R;
        int combo = (index * 3 + L) % 8;
        c.M = combo & 1 ? 3 : 1;
        c.keyNorm = combo & 2;
        c.outputNorm = combo & 4;
        c.multiQueryForm = c.M > 1 || index % 4 == 1;
        c.perQueryOutputNorm = c.outputNorm && c.multiQueryForm && index % 2;
        c.packed = index % 3 == 0;
        c.saveOPre = index % 5 != 2;
        c.residual = c.saveOPre && storage == Elem::BF16 && D % 2 == 0 &&
                     (index % 4 == 0 || index % 4 == 3);
        c.gradLse = kind == Kind::Backward && (index / 2) % 3 == 1;
        c.accumulate = kind == Kind::Backward && index % 4 == 2;
        c.scale = index % 7 == 3 ? 0.5 : 1.0;
        // Keep L * N * D near a million elements or fewer.
        int64_t N = std::clamp<int64_t>(1200000 / (L * D), 1, 40);
        if (index % 6 == 4 && N >= 4)
          c.tokens = {2, N / 2}; // two token dimensions
        else if (index % 11 == 5)
          c.tokens = {}; // a single token: sources of rank 1
        else
          c.tokens = {N};
        c.dynamicTokens = index % 9 != 7;
        c.seed = 1000 + index;
        cases.push_back(c);
        ++index;
      }
  return cases;
}

/// The edge cases of docs/Numerics.md: eps at its extremes, large logits, a
/// zero query, near-zero sources, scale edge values, M = 16.
std::vector<Case> edgeCases() {
  std::vector<Case> cases;
  uint64_t seed = 5000;
  for (Kind kind : {Kind::Forward, Kind::Backward})
    for (Elem storage : {Elem::F32, Elem::BF16}) {
      auto base = [&]() {
        Case c;
        c.kind = kind, c.storage = storage, c.params = storage;
        c.L = 7, c.D = 64, c.R = 16, c.M = 3, c.multiQueryForm = true;
        c.keyNorm = true, c.outputNorm = true, c.tokens = {9};
        c.seed = seed++;
        return c;
      };
      Case c = base();
      c.eps = 1e-30; // the smallest eps: RMS norms with no floor
      cases.push_back(c);
      c = base();
      c.eps = 1e4; // a huge eps dominates every mean square
      cases.push_back(c);
      c = base();
      c.inputs = Inputs::NearZeroSources; // eps dominates the key norm
      cases.push_back(c);
      c = base();
      c.inputs = Inputs::NearZeroSources;
      c.eps = 1e-30;
      cases.push_back(c);
      c = base();
      c.inputs = Inputs::LargeLogits; // |z| ~ 1e4
      cases.push_back(c);
      c = base();
      c.inputs = Inputs::LargeLogits;
      c.L = 33, c.outputNorm = false, c.M = 1, c.multiQueryForm = false;
      cases.push_back(c);
      c = base();
      c.inputs = Inputs::ZeroQuery; // uniform weights
      cases.push_back(c);
      c = base();
      c.scale = -2.5; // a negative scale flips the softmax
      cases.push_back(c);
      c = base();
      c.scale = 0.0; // uniform weights, zero query gradient path
      cases.push_back(c);
      c = base();
      c.M = 16; // the largest query count, with [M, D] output norm
      c.perQueryOutputNorm = true;
      cases.push_back(c);
      c = base();
      c.tokens = {2, 3, 5}; // three token dimensions, static
      c.dynamicTokens = false;
      cases.push_back(c);
      c = base();
      c.saveOPre = false; // recompute
      c.packed = true;
      cases.push_back(c);
      if (storage == Elem::BF16) {
        c = base();
        c.residual = true; // o_pre's residual, with an [M, D] output norm
        c.perQueryOutputNorm = true;
        cases.push_back(c);
        c = base();
        c.residual = true; // tiny o_pre: residuals of small exponents
        c.inputs = Inputs::NearZeroSources;
        c.outputNorm = false;
        cases.push_back(c);
        c = base();
        c.residual = true; // f32 gradients held to the residual's accuracy
        c.params = Elem::F32;
        cases.push_back(c);
      }
      // One source, where every softmax weight is 1: exact results, with
      // the saved o_pre and recomputing it from the lse, one query and
      // three, with the norms and without.
      for (bool saveOPre : {true, false})
        for (bool norms : {false, true})
          for (int64_t M : {1, 3}) {
            c = base();
            c.L = 1, c.M = M, c.multiQueryForm = M > 1;
            c.saveOPre = saveOPre, c.keyNorm = norms, c.outputNorm = norms;
            c.inputs = Inputs::LargeLogits;
            c.exactOneSource = true;
            cases.push_back(c);
          }
      if (kind == Kind::Backward) {
        c = base();
        c.gradLse = true; // the lse's gradient with large logits
        c.inputs = Inputs::LargeLogits;
        cases.push_back(c);
        c = base();
        c.gradLse = true; // one source: lse = z, the gradient is dlse alone
        c.L = 1, c.outputNorm = false, c.M = 1, c.multiQueryForm = false;
        cases.push_back(c);
      }
    }
  return cases;
}

std::vector<Case> softmaxMergeCases() {
  std::vector<Case> cases;
  uint64_t seed = 7000;
  int index = 0;
  for (int64_t P : {1, 2, 3, 8, 64})
    for (Sink sink : {Sink::None, Sink::NegInf, Sink::PosInf, Sink::Finite})
      for (Empty empty :
           {Empty::None, Empty::Some, Empty::AllInSomeRows, Empty::All}) {
        if ((index++ % 2) && !(P == 1 || empty == Empty::All))
          continue; // every pair of (P, sink, empty) without the full cube
        Case c;
        c.kind = Kind::Softmax;
        c.P = P, c.sink = sink, c.empty = empty;
        int kept = cases.size();
        c.D = (kept % 3 == 0) ? 769 : 64;
        c.tokens = kept % 4 == 0 ? std::vector<int64_t>{2, 3}
                                 : std::vector<int64_t>{5};
        c.storage = kept % 2 ? Elem::BF16 : Elem::F32;
        c.params = c.storage;
        // The output norm of a split forward, with a shared or a per-row
        // ([K, D], K the leading token dimension) weight.
        c.outputNorm = kept % 3 == 1;
        c.perQueryOutputNorm = c.outputNorm && c.tokens.size() == 2;
        c.seed = seed++;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> sumCases() {
  std::vector<Case> cases;
  uint64_t seed = 9000;
  for (int64_t P : {1, 2, 64, 257})
    for (std::vector<int64_t> shape :
         {std::vector<int64_t>{}, std::vector<int64_t>{16},
          std::vector<int64_t>{3, 769}})
      for (Elem storage : {Elem::F32, Elem::BF16}) {
        Case c;
        c.kind = Kind::Sum;
        c.P = P, c.tokens = shape, c.storage = storage;
        c.dynamicTokens = shape.size() == 1;
        c.seed = seed++;
        cases.push_back(c);
      }
  return cases;
}

std::vector<Case> suite(const std::string &name, bool &known) {
  known = true;
  if (name == "forward-f32")
    return matrix(Kind::Forward, Elem::F32);
  if (name == "forward-bf16")
    return matrix(Kind::Forward, Elem::BF16);
  if (name == "backward-f32")
    return matrix(Kind::Backward, Elem::F32);
  if (name == "backward-bf16")
    return matrix(Kind::Backward, Elem::BF16);
  if (name == "edge")
    return edgeCases();
  if (name == "softmax-merge")
    return softmaxMergeCases();
  if (name == "sum")
    return sumCases();
  known = false;
  return {};
}

} // namespace

int main(int argc, char **argv) {
  llvm::cl::opt<std::string> suiteName(
      "suite",
      llvm::cl::desc("forward-f32, forward-bf16, backward-f32, "
                     "backward-bf16, edge, softmax-merge, sum, or "
                     "reference-gradients"),
      llvm::cl::Required);
  llvm::cl::list<std::string> prePipelines(
      "pre-pipeline",
      llvm::cl::desc("passes to run on each func.func before lowering, in "
                     "textual pipeline syntax; each occurrence is one variant "
                     "compared with the plain lowering and the reference"));
  llvm::cl::opt<std::string> filter(
      "filter",
      llvm::cl::desc("run only cases whose description contains "
                     "this text"),
      llvm::cl::init(""));
  llvm::cl::opt<bool> printIR("print-ir",
                              llvm::cl::desc("print each generated module"),
                              llvm::cl::init(false));
  llvm::cl::ParseCommandLineOptions(argc, argv, "attnres numerics driver\n");

  if (suiteName == "reference-gradients") {
    double worst = ref::checkGradientsByFiniteDifferences(/*verbose=*/true);
    bool ok = worst < 1e-6;
    std::printf("suite reference-gradients: %s (max relative error %.3g, "
                "limit 1e-6)\n",
                ok ? "passed" : "FAILED", worst);
    return ok ? 0 : 1;
  }

  bool known;
  std::vector<Case> cases = suite(suiteName, known);
  if (!known) {
    llvm::errs() << "error: unknown suite '" << suiteName << "'\n";
    return 2;
  }

  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  DialectRegistry registry;
  attnres::registerAllDialects(registry);
  attnres::registerAllPasses();
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  Runner runner(
      context,
      std::vector<std::string>(prePipelines.begin(), prePipelines.end()),
      printIR);

  int passed = 0, total = 0;
  for (const Case &c : cases) {
    std::string description = c.describe();
    if (!filter.empty() && description.find(filter) == std::string::npos)
      continue;
    ++total;
    Outcome outcome = runCase(runner, c);
    passed += outcome.passed;
    std::printf("%s %s:%s\n", outcome.passed ? "PASS" : "FAIL",
                description.c_str(), outcome.detail.c_str());
    std::fflush(stdout);
  }
  std::printf("suite %s: %d of %d cases passed\n", suiteName.c_str(), passed,
              total);
  return passed == total && total > 0 ? 0 : 1;
}
