//===- Bundle.h - kernel bundles: binaries and a manifest -------*- C++ -*-===//
//
// A kernel bundle is what the runtime loads: the GPU binaries of a module's
// attnres ops and `manifest.json`, which names every kernel, its arguments
// in order, its grid and block rules as functions of the token count, its
// workgroup memory, and the compile options and compiler version. The format
// is documented in docs/Bundle.md.
//
//===----------------------------------------------------------------------===//

#ifndef ATTNRES_BUNDLE_BUNDLE_H
#define ATTNRES_BUNDLE_BUNDLE_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/LLVM.h"

#include <string>
#include <vector>

namespace mlir::attnres {

struct BundleOptions {
  /// sm_80, sm_90, sm_100, ... (NVIDIA) or gfx942, gfx950, ... (AMD).
  std::string target = "sm_90";
  /// "bin" (cubin / hsaco), "isa" (PTX / AMDGPU assembly) or "fatbin".
  std::string format = "bin";
  int optLevel = 3;
  /// Options of convert-attnres-to-gpu in pass-option syntax, e.g.
  /// "threads-per-row=256 source-batch=4"; empty: its defaults. The subgroup
  /// size is the target's.
  std::string kernelOptions;
  /// Empty: the defaults the project was configured with.
  std::string cudaToolkit, rocmToolkit;
};

struct BundleFile {
  std::string name;
  std::string contents;
};

struct Bundle {
  std::string manifest; // JSON
  std::vector<BundleFile> files;
};

/// Compiles the attnres ops of `module` (which it consumes) for
/// `options.target`. Problems are reported through the context's
/// diagnostics.
FailureOr<Bundle> compileBundle(ModuleOp module, const BundleOptions &options);

/// Writes `bundle` into `directory` (created if needed).
LogicalResult writeBundle(const Bundle &bundle, StringRef directory,
                          std::string &error);

/// A module with one function `@attnres` for a spec such as
/// "train:L=10,D=4096,dtype=bf16,key_norm,output_norm" (docs/Bundle.md).
FailureOr<OwningOpRef<ModuleOp>>
moduleFromSpec(MLIRContext *context, StringRef spec, std::string &error);

/// "attnres <version> (LLVM <version>)".
std::string compilerVersion();

} // namespace mlir::attnres

#endif // ATTNRES_BUNDLE_BUNDLE_H
