//===- fuzz-mlir.cpp - libFuzzer: MLIR text through every pipeline --------===//
//
// An input is MLIR text. It is parsed with the attnres dialects registered
// and verified; a module that verifies goes through the transforms
// (split-sources, split-reduction, tile), the CPU pipeline, the NVVM and
// ROCDL pipelines up to their ISA text (no assembler: PTX and AMDGPU
// assembly), the NVVM pipeline with keep-host (untiled and tiled), its
// host stages alone (attnres-bufferize-host, attnres-launch-kernels and
// attnres-lower-tiles-to-gpu: kernel descriptions, attnres.launch
// attributes, the ops on buffers and tile loops on views are input too), and
// upstream one-shot bufferization, which the ops' BufferizableOpInterface
// joins. Diagnostics are the expected answer to bad input; a crash, an
// abort or a sanitizer report is a bug.
//
//===----------------------------------------------------------------------===//

#include "attnres/InitAll.h"
#include "attnres/Pipelines/Pipelines.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include <cstddef>
#include <cstdint>
#include <string>

using namespace mlir;

namespace {
MLIRContext &context() {
  static MLIRContext *shared = [] {
    DialectRegistry registry;
    attnres::registerAllDialects(registry);
    attnres::registerAllPasses();
    auto *context = new MLIRContext(registry);
    context->loadAllAvailableDialects();
    context->printOpOnDiagnostic(false);
    return context;
  }();
  return *shared;
}

/// Runs `pipeline` (textual) on a copy of `module`; failures are diagnostics.
void runPipeline(ModuleOp module, const char *pipeline) {
  OwningOpRef<ModuleOp> copy = module.clone();
  PassManager pm(&context());
  if (failed(parsePassPipeline(pipeline, pm)))
    __builtin_trap(); // the pipelines below are ours: they must parse
  (void)pm.run(*copy);
}
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  MLIRContext &ctx = context();
  ScopedDiagnosticHandler quiet(&ctx, [](Diagnostic &) { return success(); });
  std::string text(reinterpret_cast<const char *>(data), size);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(text, &ctx);
  if (!module || failed(verify(*module)))
    return 0;
  runPipeline(*module, "builtin.module(attnres-split-sources{partitions=2},"
                       "attnres-split-reduction{blocks=3},attnres-tile)");
  runPipeline(*module, "builtin.module(attnres-lower-to-llvm-cpu-pipeline)");
  runPipeline(*module,
              "builtin.module(attnres-lower-to-nvvm-pipeline{format=isa})");
  runPipeline(*module,
              "builtin.module(attnres-lower-to-rocdl-pipeline{format=isa})");
  // The kept host code: the whole pipeline, and its host stage alone on
  // whatever kernels and attnres.launch attributes the input states.
  runPipeline(*module, "builtin.module(attnres-lower-to-nvvm-pipeline{"
                       "format=isa keep-host=1})");
  runPipeline(*module, "builtin.module(attnres-bufferize-host,"
                       "attnres-launch-kernels)");
  runPipeline(*module, "builtin.module(attnres-launch-kernels)");
  // A forward's tile loop: tiled by the pipeline, and as the input has it
  // (on tensors through bufferization, or on views already).
  runPipeline(*module, "builtin.module(attnres-lower-to-nvvm-pipeline{"
                       "format=isa keep-host=1 tile-sizes=1,5})");
  runPipeline(*module, "builtin.module(attnres-bufferize-host,"
                       "attnres-lower-tiles-to-gpu,gpu-kernel-outlining)");
  runPipeline(*module, "builtin.module(attnres-lower-tiles-to-gpu)");
  runPipeline(*module, "builtin.module(one-shot-bufferize{"
                       "bufferize-function-boundaries})");
  return 0;
}
