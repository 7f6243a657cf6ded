//===- downstream-opt.cpp - an opt tool of another project with attnres ---===//
//
// What a compiler that embeds attnres does: register the attnres dialect,
// passes and pipelines next to its own, then run MLIR's opt driver.
//
//===----------------------------------------------------------------------===//

#include "attnres/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::attnres::registerAllDialects(registry);
  mlir::attnres::registerAllPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "downstream-opt: attnres in another project's tool\n",
      registry));
}
