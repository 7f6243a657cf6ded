//===- AttnResPlugin.cpp - attnres as a plugin of upstream mlir-opt -------===//
//
// One shared module with both plugin entry points of upstream MLIR tools:
//
//   mlir-opt-22 --load-dialect-plugin=AttnResPlugin.so \
//               --load-pass-plugin=AttnResPlugin.so ...
//
// The dialect plugin registers the attnres dialect with what its lowerings
// need (interface models, LLVM IR translations); the pass plugin registers
// the attnres passes and pipelines. The upstream passes are the tool's own:
// registering them again from here would duplicate its pipelines.
//
//===----------------------------------------------------------------------===//

#include "attnres/InitAll.h"

#include "mlir/Tools/Plugins/DialectPlugin.h"
#include "mlir/Tools/Plugins/PassPlugin.h"
#include "llvm/Config/llvm-config.h"

using namespace mlir;

extern "C" LLVM_ATTRIBUTE_WEAK DialectPluginLibraryInfo
mlirGetDialectPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "AttnRes", LLVM_VERSION_STRING,
          [](DialectRegistry *registry) {
            attnres::registerAllDialects(*registry);
          }};
}

extern "C" LLVM_ATTRIBUTE_WEAK PassPluginLibraryInfo mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "AttnResPasses", LLVM_VERSION_STRING,
          [] { attnres::registerAttnResPasses(); }};
}
