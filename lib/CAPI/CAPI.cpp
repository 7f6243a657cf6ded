//===- CAPI.cpp - the attnres C API ---------------------------------------===//

#include "attnres-c/Compiler.h"
#include "attnres-c/Dialects.h"

#include "attnres/Bundle/Bundle.h"
#include "attnres/Dialect/AttnRes/IR/AttnResDialect.h"
#include "attnres/InitAll.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

using namespace mlir;

MLIR_DEFINE_CAPI_DIALECT_REGISTRATION(AttnRes, attnres,
                                      mlir::attnres::AttnResDialect)

struct AttnresBundle {
  attnres::Bundle bundle;
};

namespace {

/// Collects the diagnostics of `context` while alive.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(MLIRContext *context)
      : handler(context, [this](Diagnostic &diagnostic) {
          if (!messages.empty())
            messages += "\n";
          append(diagnostic);
          for (Diagnostic &note : diagnostic.getNotes()) {
            messages += "\n  note: ";
            append(note);
          }
          return success();
        }) {}
  std::string messages;

private:
  /// "file:line:col: message" where the IR has a source position, the bare
  /// message otherwise: callers print these, so MLIR's loc(...) syntax would
  /// only be noise.
  void append(Diagnostic &diagnostic) {
    auto position = dyn_cast<FileLineColLoc>(diagnostic.getLocation());
    if (position && position.getLine() != 0)
      messages +=
          (position.getFilename().getValue() + ":" + Twine(position.getLine()) +
           ":" + Twine(position.getColumn()) + ": ")
              .str();
    messages += diagnostic.str();
  }
  ScopedDiagnosticHandler handler;
};

void setError(char **error, const std::string &message) {
  if (error)
    *error = strdup(message.c_str());
}

attnres::BundleOptions toOptions(const AttnresCompileOptions *options) {
  attnres::BundleOptions result;
  if (options) {
    if (options->target)
      result.target = options->target;
    if (options->format)
      result.format = options->format;
    if (options->opt_level >= 0)
      result.optLevel = options->opt_level;
    if (options->kernel_options)
      result.kernelOptions = options->kernel_options;
  }
  return result;
}

AttnresBundle *compile(ModuleOp module, const AttnresCompileOptions *options,
                       char **error) {
  DiagnosticCollector diagnostics(module.getContext());
  FailureOr<attnres::Bundle> bundle =
      attnres::compileBundle(module, toOptions(options));
  if (failed(bundle)) {
    setError(error, diagnostics.messages.empty() ? "compilation failed"
                                                 : diagnostics.messages);
    return nullptr;
  }
  return new AttnresBundle{std::move(*bundle)};
}

/// Serializes the string entry points: they share one context, and each
/// call's diagnostics must reach only its own collector.
std::mutex sharedContextMutex;

MLIRContext &sharedContext() {
  // One context for the string entry points, set up once.
  static MLIRContext *context = [] {
    DialectRegistry registry;
    attnres::registerAllDialects(registry);
    auto *created = new MLIRContext(registry);
    created->loadAllAvailableDialects();
    return created;
  }();
  return *context;
}

} // namespace

extern "C" {

void attnresRegisterAllDialects(MlirDialectRegistry registry) {
  attnres::registerAllDialects(*unwrap(registry));
}

void attnresRegisterAllPasses(void) { attnres::registerAllPasses(); }

AttnresBundle *attnresCompileSpec(const char *spec,
                                  const AttnresCompileOptions *options,
                                  char **error) {
  if (!spec) {
    setError(error, "spec must not be null");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(sharedContextMutex);
  MLIRContext &context = sharedContext();
  std::string message;
  auto module = attnres::moduleFromSpec(&context, spec, message);
  if (failed(module)) {
    setError(error, message);
    return nullptr;
  }
  return compile(module->get(), options, error);
}

AttnresBundle *attnresCompileSource(const char *source, size_t length,
                                    const AttnresCompileOptions *options,
                                    char **error) {
  if (!source) {
    setError(error, "source must not be null");
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(sharedContextMutex);
  MLIRContext &context = sharedContext();
  DiagnosticCollector diagnostics(&context);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(
      llvm::StringRef(source, length), &context, "attnres-input");
  if (!module) {
    setError(error, diagnostics.messages);
    return nullptr;
  }
  return compile(module.get(), options, error);
}

AttnresBundle *attnresCompileModule(MlirModule module,
                                    const AttnresCompileOptions *options,
                                    char **error) {
  if (mlirModuleIsNull(module)) {
    setError(error, "module must not be null");
    return nullptr;
  }
  ModuleOp op = unwrap(module);
  if (!op.getContext()->getLoadedDialect<attnres::AttnResDialect>() &&
      !op.getContext()->getDialectRegistry().getDialectAllocator("attnres")) {
    setError(error, "the module's context does not know the attnres dialect "
                    "(register it with mlirGetDialectHandle__attnres__())");
    return nullptr;
  }
  return compile(op, options, error);
}

const char *attnresBundleManifest(const AttnresBundle *b) {
  return b ? b->bundle.manifest.c_str() : nullptr;
}

size_t attnresBundleNumFiles(const AttnresBundle *b) {
  return b ? b->bundle.files.size() : 0;
}

const char *attnresBundleFileName(const AttnresBundle *b, size_t index) {
  if (!b || index >= b->bundle.files.size())
    return nullptr;
  return b->bundle.files[index].name.c_str();
}

const void *attnresBundleFileData(const AttnresBundle *b, size_t index,
                                  size_t *size) {
  if (!b || index >= b->bundle.files.size()) {
    if (size)
      *size = 0;
    return nullptr;
  }
  if (size)
    *size = b->bundle.files[index].contents.size();
  return b->bundle.files[index].contents.data();
}

int attnresBundleWrite(const AttnresBundle *b, const char *directory,
                       char **error) {
  if (!b || !directory) {
    setError(error, "bundle and directory must not be null");
    return 1;
  }
  std::string message;
  if (failed(attnres::writeBundle(b->bundle, directory, message))) {
    setError(error, message);
    return 1;
  }
  return 0;
}

void attnresBundleDestroy(AttnresBundle *b) { delete b; }

const char *attnresCompilerVersion(void) {
  static std::string version = attnres::compilerVersion();
  return version.c_str();
}

void attnresCompilerFreeString(char *string) { std::free(string); }

} // extern "C"
