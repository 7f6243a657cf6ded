//===- attnres-opt.cpp - the attnres optimizer driver ---------------------===//

#include "attnres/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::attnres::registerAllDialects(registry);
  mlir::attnres::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "attnres optimizer driver\n", registry));
}
