//===- attnres-compile.cpp - compile attnres ops to a kernel bundle -------===//
//
//   attnres-compile examples/full_attnres_layer.mlir --target=sm_90 -o out/
//   attnres-compile --spec=train:L=10,D=4096,dtype=bf16 --target=gfx942 -o out/
//
// Writes the GPU binaries and manifest.json into the output folder and prints
// a summary of what it produced.
//
//===----------------------------------------------------------------------===//

#include "attnres/Bundle/Bundle.h"
#include "attnres/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  // The tool links LLVM's backends, whose hundreds of options would bury
  // its own in --help; they stay settable.
  llvm::cl::OptionCategory category("attnres-compile options");
  llvm::cl::opt<std::string> input(llvm::cl::Positional,
                                   llvm::cl::desc("<input .mlir>"),
                                   llvm::cl::cat(category), llvm::cl::init(""));
  llvm::cl::opt<std::string> spec(
      "spec",
      llvm::cl::desc("compile one op from a spec instead of a file "
                     "(see docs/Bundle.md)"),
      llvm::cl::cat(category), llvm::cl::init(""));
  llvm::cl::opt<std::string> target(
      "target", llvm::cl::desc("sm_80, sm_90, sm_100, gfx942, gfx950, ..."),
      llvm::cl::cat(category), llvm::cl::init("sm_90"));
  llvm::cl::opt<std::string> format(
      "format", llvm::cl::desc("bin (cubin / hsaco), isa or fatbin"),
      llvm::cl::cat(category), llvm::cl::init("bin"));
  llvm::cl::opt<int> optLevel("opt-level", llvm::cl::desc("0 to 3"),
                              llvm::cl::cat(category), llvm::cl::init(3));
  llvm::cl::opt<std::string> kernelOptions(
      "kernel-options",
      llvm::cl::desc("options of convert-attnres-to-gpu, e.g. "
                     "\"threads-per-row=256 source-batch=4\""),
      llvm::cl::cat(category), llvm::cl::init(""));
  llvm::cl::opt<std::string> output("o", llvm::cl::desc("output folder"),
                                    llvm::cl::cat(category),
                                    llvm::cl::init("bundle"));
  llvm::cl::opt<bool> quiet("quiet", llvm::cl::desc("print nothing on success"),
                            llvm::cl::cat(category), llvm::cl::init(false));
  llvm::cl::HideUnrelatedOptions(category);
  llvm::cl::ParseCommandLineOptions(argc, argv,
                                    "attnres kernel bundle compiler\n");

  if (input.empty() == spec.empty()) {
    llvm::errs() << "error: give either an input file or --spec\n";
    return 2;
  }
  DialectRegistry registry;
  attnres::registerAllDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();

  OwningOpRef<ModuleOp> module;
  if (!spec.empty()) {
    std::string error;
    auto built = attnres::moduleFromSpec(&context, spec, error);
    if (failed(built)) {
      llvm::errs() << "error: " << error << "\n";
      return 1;
    }
    module = std::move(*built);
  } else {
    llvm::SourceMgr sources;
    SourceMgrDiagnosticHandler handler(sources, &context);
    module = parseSourceFile<ModuleOp>(input, sources, &context);
    if (!module)
      return 1;
  }

  attnres::BundleOptions options;
  options.target = target;
  options.format = format;
  options.optLevel = optLevel;
  options.kernelOptions = kernelOptions;
  llvm::SourceMgr diagnosticSources;
  SourceMgrDiagnosticHandler handler(diagnosticSources, &context);
  FailureOr<attnres::Bundle> bundle =
      attnres::compileBundle(module.get(), options);
  if (failed(bundle))
    return 1;
  std::string error;
  if (failed(attnres::writeBundle(*bundle, output, error))) {
    llvm::errs() << "error: " << error << "\n";
    return 1;
  }
  if (quiet)
    return 0;

  llvm::outs() << "bundle " << output << " (" << target << ", "
               << attnres::compilerVersion() << ")\n";
  for (const attnres::BundleFile &file : bundle->files)
    llvm::outs() << "  " << file.name << "  " << file.contents.size()
                 << " bytes\n";
  llvm::outs() << "  manifest.json\n";
  llvm::Expected<llvm::json::Value> manifest =
      llvm::json::parse(bundle->manifest);
  if (!manifest) {
    llvm::errs() << "error: " << llvm::toString(manifest.takeError()) << "\n";
    return 1;
  }
  for (const llvm::json::Value &kernel :
       *manifest->getAsObject()->getArray("kernels")) {
    const llvm::json::Object &object = *kernel.getAsObject();
    llvm::outs() << "kernel " << *object.getString("name") << "  role "
                 << *object.getString("role") << "  block "
                 << *object.getInteger("block") << "  args (";
    bool first = true;
    for (const llvm::json::Value &argument : *object.getArray("arguments")) {
      llvm::outs() << (first ? "" : ", ")
                   << *argument.getAsObject()->getString("name");
      first = false;
    }
    llvm::outs() << ")\n";
  }
  return 0;
}
